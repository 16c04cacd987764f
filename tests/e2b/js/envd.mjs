// Drives sandbox-gateway's envd data plane (the in-sandbox agent) with the unmodified e2b JS
// SDK (e2b@2.51.0): `sandbox.commands`, `sandbox.files` and `sandbox.pty`.
//
//   E2B_DEBUG=true E2B_ENVD_VERSION=0.6.4 E2B_ENVD_ACCESS_TOKEN=<token> E2B_ENVD_USER=user \
//     node tests/e2b/js/envd.mjs
//
// With E2B_DEBUG=true the SDK talks straight to http://localhost:49983 (tests/envd_sdk.rs starts
// the agent there) and the sandbox object is built with the claimed envd version and the
// agent's access token. Without it, a sandbox is created through E2B_API_URL/E2B_API_KEY (with
// E2B_SANDBOX_URL naming the data plane), so the same file can run through the gateway.
// Scenarios run one after another; the first failure is printed and the process exits 1. The
// last line is `N passed, M failed`.

import assert from 'node:assert/strict'
import { randomBytes, randomUUID } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'

import { AuthenticationError, CommandExitError, FileType, FilesystemEventType, Sandbox } from 'e2b'

import { rejects, runScenarios } from './harness.mjs'

const DEBUG = (process.env.E2B_DEBUG ?? '').toLowerCase() === 'true'
const ENVD_VERSION = process.env.E2B_ENVD_VERSION || '0.6.4'
const TOKEN = process.env.E2B_ENVD_ACCESS_TOKEN || undefined
const OTHER_USER = process.env.E2B_ENVD_USER || undefined
const RUN = randomUUID().replace(/-/g, '').slice(0, 10)
const MIB = 1024 * 1024

async function makeSandbox() {
  if (DEBUG) {
    return new Sandbox({ sandboxId: 'debug_sandbox_id', envdVersion: ENVD_VERSION, envdAccessToken: TOKEN, debug: true })
  }
  return await Sandbox.create({ timeoutMs: 300_000 })
}

async function waitUntil(pred, what, timeoutMs = 10_000) {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    if (await pred()) return
    await sleep(50)
  }
  throw new Error(`timed out waiting for ${what}`)
}

let sbx
let work

const scenarios = []
const scenario = (name, fn) => scenarios.push({ name, fn })

scenario('output and exit codes', async () => {
  const r = await sbx.commands.run('echo out; echo err >&2')
  assert.deepEqual([r.stdout, r.stderr, r.exitCode], ['out\n', 'err\n', 0])
  const e = await rejects(sbx.commands.run('echo partial; exit 3'), CommandExitError, 'exit 3')
  assert.equal(e.exitCode, 3)
  assert.equal(e.stdout, 'partial\n')
})

scenario('envs, cwd and users', async () => {
  const r = await sbx.commands.run('echo "$GREETING|$PWD|$USER"', { envs: { GREETING: 'hi there' }, cwd: work, user: 'root' })
  assert.equal(r.stdout.trim(), `hi there|${work}|root`)
  await rejects(sbx.commands.run('true', { user: 'no-such-user-here' }), AuthenticationError, 'unknown user')
  if (OTHER_USER) {
    const u = await sbx.commands.run('id -un', { user: OTHER_USER })
    assert.equal(u.stdout.trim(), OTHER_USER)
  }
})

scenario('streaming callbacks', async () => {
  const seen = []
  await sbx.commands.run('for i in 1 2 3; do echo $i; sleep 0.3; done', { onStdout: (d) => seen.push([d, Date.now()]) })
  assert.equal(seen.map(([d]) => d).join(''), '1\n2\n3\n')
  assert.ok(seen.at(-1)[1] - seen[0][1] > 400, 'output arrives as it is produced')
})

scenario('background, list, connect, kill', async () => {
  const h = await sbx.commands.run('sleep 30', { background: true })
  const listed = await sbx.commands.list()
  const mine = listed.find((p) => p.pid === h.pid)
  assert.ok(mine, 'listed')
  assert.equal(mine.cmd, '/bin/bash')
  assert.equal(mine.args.at(-1), 'sleep 30')
  const again = await sbx.commands.connect(h.pid)
  assert.equal(await sbx.commands.kill(h.pid), true)
  for (const handle of [h, again]) {
    const e = await rejects(handle.wait(), CommandExitError, 'killed')
    assert.equal(e.exitCode, -1)
    assert.match(e.error ?? '', /signal: killed/)
  }
  await waitUntil(async () => !(await sbx.commands.list()).some((p) => p.pid === h.pid), 'the list to drop it')
  assert.equal(await sbx.commands.kill(h.pid), false)
})

scenario('stdin send and close', async () => {
  const h = await sbx.commands.run('cat; echo end', { background: true, stdin: true })
  await sbx.commands.sendStdin(h.pid, 'line one\n')
  await sbx.commands.closeStdin(h.pid)
  const r = await h.wait()
  assert.equal(r.stdout, 'line one\nend\n')
})

scenario('files round trips', async () => {
  await sbx.files.write(`${work}/a/b/hello.txt`, 'héllo\n')
  assert.equal(await sbx.files.read(`${work}/a/b/hello.txt`), 'héllo\n')
  const blob = randomBytes(10 * MIB)
  await sbx.files.write(`${work}/blob.bin`, blob)
  const back = await sbx.files.read(`${work}/blob.bin`, { format: 'bytes' })
  assert.ok(Buffer.from(back).equals(blob), '10 MiB binary round trip')
  await sbx.files.writeFiles([
    { path: `${work}/m1.txt`, data: 'one' },
    { path: `${work}/deep/m2.txt`, data: 'two' },
  ])
  assert.equal(await sbx.files.read(`${work}/deep/m2.txt`), 'two')
})

scenario('list, exists, makeDir, rename, remove, getInfo', async () => {
  await sbx.files.write(`${work}/l/top.txt`, 'x')
  await sbx.files.write(`${work}/l/sub/inner.txt`, 'yy')
  const one = (await sbx.files.list(`${work}/l`)).map((e) => e.name).sort()
  assert.deepEqual(one, ['sub', 'top.txt'])
  const two = (await sbx.files.list(`${work}/l`, { depth: 2 })).map((e) => e.path).sort()
  assert.deepEqual(two, [`${work}/l/sub`, `${work}/l/sub/inner.txt`, `${work}/l/top.txt`])
  assert.equal(await sbx.files.exists(`${work}/l/top.txt`), true)
  assert.equal(await sbx.files.exists(`${work}/l/nope`), false)
  assert.equal(await sbx.files.makeDir(`${work}/l/new/nested`), true)
  assert.equal(await sbx.files.makeDir(`${work}/l/new/nested`), false)
  const moved = await sbx.files.rename(`${work}/l/top.txt`, `${work}/l/moved/top2.txt`)
  assert.equal(moved.path, `${work}/l/moved/top2.txt`)
  const info = await sbx.files.getInfo(`${work}/l/sub/inner.txt`)
  assert.equal(info.type, FileType.FILE)
  assert.equal(info.size, 2)
  assert.match(info.permissions, /^-rw/)
  await sbx.files.remove(`${work}/l/sub`)
  assert.equal(await sbx.files.exists(`${work}/l/sub`), false)
})

scenario('watchDir streaming, recursive, with entries', async () => {
  await sbx.files.makeDir(`${work}/w/sub`)
  const events = []
  const handle = await sbx.files.watchDir(`${work}/w`, (e) => events.push(e), { recursive: true, includeEntry: true })
  try {
    await sbx.files.write(`${work}/w/top.txt`, 'a')
    await sbx.files.write(`${work}/w/sub/inner.txt`, 'b')
    await waitUntil(() => events.some((e) => e.name === 'sub/inner.txt' && e.type === FilesystemEventType.WRITE), 'recursive events')
  } finally {
    await handle.stop()
  }
  assert.ok(events.some((e) => e.name === 'top.txt' && e.type === FilesystemEventType.CREATE))
  const w = events.find((e) => e.name === 'sub/inner.txt' && e.type === FilesystemEventType.WRITE)
  assert.equal(w.entry?.path, `${work}/w/sub/inner.txt`)
})

scenario('metadata', async () => {
  const info = await sbx.files.write(`${work}/meta.txt`, 'm', { metadata: { author: 'me' } })
  assert.deepEqual(info.metadata, { author: 'me' })
  assert.deepEqual((await sbx.files.getInfo(`${work}/meta.txt`)).metadata, { author: 'me' })
})

// Signed URLs carry no sandbox id: through a gateway only the host name routes them (domain
// mode, not E2B_SANDBOX_URL).
const HOST_ROUTED = DEBUG || !process.env.E2B_SANDBOX_URL

scenario('signed URLs', async () => {
  if (!HOST_ROUTED) return 'skipped: domain mode only'
  if (!TOKEN && !DEBUG && !sbx.envdAccessToken) return 'skipped: no access token'
  await sbx.files.write(`${work}/signed.txt`, 'signed content')
  const url = await sbx.downloadUrl(`${work}/signed.txt`, { useSignatureExpiration: 60 })
  const r = await fetch(url)
  assert.equal(r.status, 200)
  assert.equal(await r.text(), 'signed content')
  const bad = await fetch(url.replace('signature=v1_', 'signature=v1_x'))
  assert.equal(bad.status, 401)
  const up = await sbx.uploadUrl(`${work}/uploaded.txt`)
  const form = new FormData()
  form.append('file', new Blob([Buffer.from('via url')]), 'uploaded.txt')
  const ur = await fetch(up, { method: 'POST', body: form })
  assert.equal(ur.status, 200, await ur.text())
  assert.equal(await sbx.files.read(`${work}/uploaded.txt`), 'via url')
})

scenario('pty: create, input, resize, kill', async () => {
  const chunks = []
  const text = () => Buffer.concat(chunks).toString()
  const h = await sbx.pty.create({ cols: 80, rows: 24, cwd: '/tmp', onData: (d) => chunks.push(Buffer.from(d)) })
  const ended = h.wait().catch(() => undefined)
  await sbx.pty.sendInput(h.pid, new TextEncoder().encode('echo TERM=$TERM; stty size\n'))
  await waitUntil(() => text().includes('24 80') && text().includes('TERM=xterm-256color'), 'pty output')
  await sbx.pty.resize(h.pid, { cols: 100, rows: 30 })
  await sbx.pty.sendInput(h.pid, new TextEncoder().encode('stty size\n'))
  await waitUntil(() => text().includes('30 100'), 'the resized terminal')
  assert.equal(await sbx.pty.kill(h.pid), true)
  await ended
})

scenario('kill during a running command ends its stream', async () => {
  const h = await sbx.commands.run('echo started; sleep 60', { background: true })
  await sleep(300)
  const t0 = Date.now()
  setTimeout(() => sbx.commands.kill(h.pid), 300)
  const e = await rejects(h.wait(), CommandExitError, 'killed while running')
  assert.ok(Date.now() - t0 < 10_000)
  assert.equal(e.exitCode, -1)
})

async function main() {
  sbx = await makeSandbox()
  work = `/tmp/envd-js-${RUN}`
  await sbx.commands.run(`mkdir -p ${work} && chmod 777 ${work}`, { user: 'root' })
  let failed = 1
  try {
    failed = await runScenarios(scenarios)
  } finally {
    await sbx.commands.run(`rm -rf ${work}`, { user: 'root' }).catch(() => undefined)
    if (!DEBUG) await sbx.kill().catch(() => undefined)
  }
  process.exit(failed ? 1 : 0)
}

await main()
