// Sandbox lifecycle with the unmodified e2b JS SDK (e2b@2.51.0) through the gateway:
// `lifecycle: {onTimeout: 'pause', autoResume: true}` pauses at the end of the timeout with the
// processes' memory kept, and the next command wakes the sandbox. Run by
// tests/e2b_lifecycle.rs with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set.

import assert from 'node:assert/strict'
import { setTimeout as sleep } from 'node:timers/promises'

import { Sandbox } from 'e2b'

async function waitState(id, state, timeoutMs) {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const info = await Sandbox.getInfo(id)
    if (info.state === state) return info
    assert.ok(Date.now() < deadline, `${id} stayed ${info.state}`)
    await sleep(250)
  }
}

async function main() {
  const sbx = await Sandbox.create({ timeoutMs: 8_000, lifecycle: { onTimeout: 'pause', autoResume: true } })
  try {
    const info = await Sandbox.getInfo(sbx.sandboxId)
    assert.deepEqual(info.lifecycle, { onTimeout: 'pause', autoResume: true })
    // A process that must survive the pause as itself.
    const h = await sbx.commands.run('sleep 600', { background: true })
    // Stop following it: a pause cuts open streams, and this SDK answers a stream cut
    // mid-request by probing envd's /health, which is traffic and so wakes an auto-resuming
    // sandbox at once (as any request does); the pause this scenario waits for would be gone
    // within milliseconds.
    await h.disconnect()
    await waitState(sbx.sandboxId, 'paused', 20_000)
    // Lists come from the gateway's read view, which follows the nodes' change streams and
    // waits up to a second for the state a live read saw; on a loaded machine it may trail a
    // moment longer.
    const listedPaused = async () =>
      (await Sandbox.list({ query: { state: ['paused'] } }).nextItems()).some((s) => s.sandboxId === sbx.sandboxId)
    let listed = await listedPaused()
    for (let i = 0; !listed && i < 20; i++) {
      await sleep(250)
      listed = await listedPaused()
    }
    assert.ok(listed, 'paused sandbox listed as paused')
    // The data plane wakes it: the background process is the same one.
    const ps = await sbx.commands.run(`kill -0 ${h.pid} && echo alive`)
    assert.equal(ps.stdout.trim(), 'alive')
    const running = await Sandbox.getInfo(sbx.sandboxId)
    assert.equal(running.state, 'running')
    assert.ok(running.endAt.getTime() - Date.now() > 1_000, 'resume grants the timeout again')
  } finally {
    await sbx.kill()
  }
  console.log('1 passed, 0 failed')
}

main().catch((e) => {
  console.error(e)
  console.log('0 passed, 1 failed')
  process.exit(1)
})
