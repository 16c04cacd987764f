// Network policies with the unmodified e2b JS SDK (e2b@2.51.0): `network.denyOut` turns a
// destination away from inside the sandbox, `updateNetwork` lifts it on the running sandbox,
// and `getInfo` reports the policy. Run by tests/e2b_network.rs in the same private network
// namespace as the Python scenarios, with SERVER_A and SERVER_B serving HTTP on port 8081.

import assert from 'node:assert/strict'
import http from 'node:http'

import { Sandbox } from 'e2b'

const A = process.env.SERVER_A
const B = process.env.SERVER_B
const PORT = 8081

async function serve(addr) {
  const server = http.createServer((_req, res) => res.end(addr))
  await new Promise((ok) => server.listen(PORT, addr, ok))
  return server
}

async function reaches(sbx, addr) {
  const r = await sbx.commands.run(`curl -s -m 3 http://${addr}:${PORT}/ || echo unreachable`, { timeoutMs: 30_000 })
  assert.ok([addr, 'unreachable\n'].includes(r.stdout), r.stdout)
  return r.stdout === addr
}

async function main() {
  const servers = [await serve(A), await serve(B)]
  const sbx = await Sandbox.create({ network: { denyOut: [B] } })
  try {
    assert.equal(await reaches(sbx, A), true)
    assert.equal(await reaches(sbx, B), false)
    const info = await sbx.getInfo()
    assert.deepEqual(info.network?.denyOut, [B])
    await sbx.updateNetwork({ denyOut: [A] })
    assert.equal(await reaches(sbx, A), false)
    assert.equal(await reaches(sbx, B), true)
    await sbx.updateNetwork({})
    assert.equal(await reaches(sbx, A), true)
    await assert.rejects(() => Sandbox.create({ network: { allowOut: ['example.com'] } }), /ALL_TRAFFIC/)
  } finally {
    await sbx.kill()
    for (const s of servers) s.close()
  }
  console.log('1 passed, 0 failed')
}

main().catch((e) => {
  console.error(e)
  console.log('0 passed, 1 failed')
  process.exit(1)
})
