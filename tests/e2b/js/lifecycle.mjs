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
    await waitState(sbx.sandboxId, 'paused', 20_000)
    const listed = await Sandbox.list({ query: { state: ['paused'] } }).nextItems()
    assert.ok(listed.some((s) => s.sandboxId === sbx.sandboxId), 'paused sandbox listed as paused')
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
