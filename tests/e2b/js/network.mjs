// Network policies with the unmodified e2b JS SDK (e2b@2.51.0): `network.denyOut` turns a
// destination away from inside the sandbox, `updateNetwork` lifts it on the running sandbox,
// and `getInfo` reports the policy; a header rule fills a `Secret` into the requests the
// sandbox makes to an HTTPS host. Run by tests/e2b_network.rs in the same private network
// namespace as the Python scenarios, with SERVER_A and SERVER_B serving HTTP on port 8081 and
// SERVER_A serving HTTPS as api.secure.test (the certificate the node is told to trust).

import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { readFileSync } from 'node:fs'
import http from 'node:http'
import https from 'node:https'

import { Sandbox, Secret, SecretNotFoundError, Volume } from 'e2b'

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

// The headers of every request api.secure.test answered.
const seen = []

async function serveHttps(addr) {
  const options = { cert: readFileSync(process.env.TRUSTED_CERT), key: readFileSync(process.env.TRUSTED_KEY) }
  const server = https.createServer(options, (req, res) => {
    seen.push(req.headers)
    res.end(addr)
  })
  await new Promise((ok) => server.listen(443, addr, ok))
  return server
}

async function headerRules() {
  if (process.env.RUNTIME !== 'builtin') return
  const server = await serveHttps(A)
  const name = `js-key-${randomUUID().slice(0, 8)}`
  const value = `sk-js-${randomUUID()}`
  const secret = await Secret.create(name, value)
  const sbx = await Sandbox.create({
    network: {
      rules: { 'api.secure.test': [{ transform: { headers: { Authorization: `Bearer ${Secret.fill(name)}` } } }] },
    },
  })
  try {
    assert.equal((await Secret.getInfo(secret.secretId)).name, name)
    const out = await sbx.commands.run(
      `curl -sS -m 10 --resolve api.secure.test:443:${B} https://api.secure.test/ 2>&1; echo " rc=$?"`,
      { timeoutMs: 30_000 },
    )
    assert.ok(out.stdout.startsWith(`${A} rc=0`), out.stdout)
    assert.equal(seen.at(-1).authorization, `Bearer ${value}`)
    const info = await sbx.getInfo()
    assert.ok(info.network?.rules?.['api.secure.test'], JSON.stringify(info.network))
  } finally {
    await sbx.kill()
    server.close()
    assert.equal(await Secret.destroy(name), true)
  }
  await assert.rejects(() => Secret.getInfo(name), SecretNotFoundError)
}

// A volume written through the content API, mounted by a sandbox that writes back.
async function volumes() {
  process.env.E2B_VOLUME_API_URL ??= process.env.E2B_API_URL
  const vol = await Volume.create(`js-vol-${randomUUID().slice(0, 8)}`)
  try {
    await vol.makeDir('/in', { force: true })
    await vol.writeFile('/in/hello.txt', 'from the API')
    if (process.env.RUNTIME !== 'builtin') return
    const sbx = await Sandbox.create({ volumeMounts: { '/mnt/vol': vol } })
    try {
      assert.equal((await sbx.commands.run('cat /mnt/vol/in/hello.txt')).stdout, 'from the API')
      await sbx.commands.run('echo from js > /mnt/vol/out.txt')
    } finally {
      await sbx.kill()
    }
    assert.equal(await vol.readFile('/out.txt'), 'from js\n')
    assert.deepEqual((await vol.list('/')).map((e) => e.path).sort(), ['/in', '/out.txt'])
  } finally {
    assert.equal(await Volume.destroy(vol.volumeId), true)
  }
}

async function main() {
  await headerRules()
  await volumes()
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
  console.log('3 passed, 0 failed')
}

main().catch((e) => {
  console.error(e)
  console.log('0 passed, 1 failed')
  process.exit(1)
})
