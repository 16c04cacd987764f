// Drives sandbox-gateway's e2b control plane with the unmodified e2b JS SDK (e2b@2.51.0).
//
//   E2B_API_URL=http://127.0.0.1:PORT E2B_API_KEY=<team-a key> E2B_OTHER_API_KEY=<team-b key> \
//     node tests/e2b/js/scenario.mjs
//
// (tests/e2b/run.sh starts a gateway and runs this with the Python suites.) Only control-plane
// calls are made: the gateway has no data plane (envd). Scenarios run one after another; the
// first failure is printed with its scenario name, everything created so far is killed or
// deleted, and the process exits 1. The last line is `N passed, M failed`.

import assert from 'node:assert/strict'
import { randomBytes, randomUUID } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'

import {
  AuthenticationError,
  Sandbox,
  SandboxError,
  SandboxNotFoundError,
} from 'e2b'

const API_URL = (process.env.E2B_API_URL ?? '').replace(/\/+$/, '')
const KEY_A = process.env.E2B_API_KEY ?? ''
const KEY_B = process.env.E2B_OTHER_API_KEY ?? ''
// The namespace KEY_A maps to: snapshot names are stamped `<namespace>/<name>`.
const NAMESPACE_A = process.env.E2B_NAMESPACE ?? 'team-a'
const MAX_CHECKPOINT_NAME = 63

const RUN = `js-${randomUUID().replace(/-/g, '').slice(0, 10)}`
const SANDBOX_ID = /^sb-[0-9a-f]{16}$/
const SNAPSHOT_ID = /^ck_[0-9a-f]{16}$/
const MIB = 1024 * 1024
const UNKNOWN_ID = 'sb-' + '0'.repeat(16)
// Generous: the gateway runs on this machine; these only absorb scheduling.
const CLOCK_SLACK_MS = 30_000
const LEASE_SLACK_MS = 10_000

const tag = (extra = {}) => ({ suite: RUN, ...extra })
const wrongKey = () => 'e2b_' + randomBytes(20).toString('hex')
const leaseSeconds = (info) => (info.endAt.getTime() - info.startedAt.getTime()) / 1000
const ids = (items) => items.map((i) => i.sandboxId)
const snapshotIds = (items) => items.map((s) => s.snapshotId)
const sorted = (xs) => [...xs].sort()

function assertClose(actual, expectedMs, slackMs, what) {
  const diff = Math.abs(actual.getTime() - expectedMs)
  assert.ok(
    diff <= slackMs,
    `${what}: got ${actual.toISOString()}, expected ${new Date(expectedMs).toISOString()} ± ${slackMs} ms`
  )
}

function assertApprox(actual, expected, tolerance, what) {
  assert.ok(Math.abs(actual - expected) <= tolerance, `${what}: got ${actual}, expected ${expected} ± ${tolerance}`)
}

/** Asserts that `promise` rejects with an instance of `cls` (and, if given, this HTTP status). */
async function rejects(promise, cls, status, what) {
  let value
  try {
    value = await promise
  } catch (e) {
    assert.ok(e instanceof cls, `${what}: expected ${cls.name}, got ${e?.constructor?.name}: ${e?.message}`)
    if (status !== undefined) {
      const got = e.statusCode ?? Number(/^(\d{3}):/.exec(e.message)?.[1])
      assert.equal(got, status, `${what}: expected status ${status}, got ${got} (${e.message})`)
    }
    return e
  }
  assert.fail(`${what}: expected ${cls.name}${status ? ` (${status})` : ''}, but it succeeded with ${JSON.stringify(value)}`)
}

/** A plain HTTP call, for what the SDK hides (status codes). */
async function raw(method, path, { key = KEY_A, body, query } = {}) {
  const url = new URL(API_URL + path)
  for (const [k, v] of Object.entries(query ?? {})) url.searchParams.set(k, v)
  const res = await fetch(url, {
    method,
    headers: { 'X-API-KEY': key, ...(body !== undefined && { 'Content-Type': 'application/json' }) },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  const text = await res.text()
  return { status: res.status, text, json: () => JSON.parse(text) }
}

async function listAll(opts = {}) {
  const pager = Sandbox.list(opts)
  const out = []
  let pages = 0
  while (pager.hasNext) {
    out.push(...(await pager.nextItems()))
    assert.ok(++pages < 1000, 'listing never ends')
  }
  return out
}

async function listSnapshotsAll(opts = {}) {
  const pager = Sandbox.listSnapshots(opts)
  const out = []
  let pages = 0
  while (pager.hasNext) {
    out.push(...(await pager.nextItems()))
    assert.ok(++pages < 1000, 'snapshot listing never ends')
  }
  return out
}

// ---------------------------------------------------------------------------------------------
// Cleanup: every sandbox and snapshot made is recorded with the key that owns it.

const made = { sandboxes: [], snapshots: [] }

function track(sbxOrId, key = KEY_A) {
  made.sandboxes.push({ id: typeof sbxOrId === 'string' ? sbxOrId : sbxOrId.sandboxId, key })
  return sbxOrId
}

function trackSnapshot(id, key = KEY_A) {
  made.snapshots.push({ id, key })
  return id
}

async function create(opts = {}, key = undefined) {
  const o = { metadata: tag(), ...opts, ...(key && { apiKey: key }) }
  const sbx = o.template ? await Sandbox.create(o.template, o) : await Sandbox.create(o)
  return track(sbx, key ?? KEY_A)
}

async function cleanup() {
  const errors = []
  for (const { id, key } of made.sandboxes.reverse()) {
    try {
      await Sandbox.kill(id, { apiKey: key })
    } catch (e) {
      errors.push(`kill ${id}: ${e.message}`)
    }
  }
  for (const { id, key } of made.snapshots.reverse()) {
    try {
      await Sandbox.deleteSnapshot(id, { apiKey: key })
    } catch (e) {
      errors.push(`delete snapshot ${id}: ${e.message}`)
    }
  }
  made.sandboxes = []
  made.snapshots = []
  return errors
}

// ---------------------------------------------------------------------------------------------
// Scenarios

const scenarios = []
const scenario = (name, fn) => scenarios.push({ name, fn })

scenario('create with defaults, getInfo', async () => {
  const before = Date.now()
  const sbx = await create({ metadata: tag({ owner: 'alice', note: 'a b&c=d' }), envs: { FOO: 'bar' } })
  assert.match(sbx.sandboxId, SANDBOX_ID)
  assert.equal(sbx.sandboxDomain, 'localhost')

  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(info.templateId, 'base')
  assert.equal(info.state, 'running')
  assert.equal(info.cpuCount, 1)
  assert.equal(info.memoryMB, 512)
  assert.deepEqual(info.metadata, tag({ owner: 'alice', note: 'a b&c=d' }))
  assert.ok(info.envdVersion)
  assert.equal(info.sandboxDomain, 'localhost')
  assertClose(info.startedAt, before, CLOCK_SLACK_MS, 'startedAt')
  // No timeoutMs: the v2 route's default of 300 s.
  assertApprox(leaseSeconds(info), 300, 1, 'default lease')

  const again = await Sandbox.getInfo(sbx.sandboxId)
  assert.equal(again.endAt.getTime(), info.endAt.getTime())
  assert.deepEqual(again.metadata, info.metadata)
})

scenario('create with timeoutMs', async () => {
  const sbx = await create({ timeoutMs: 120_000 })
  const info = await sbx.getInfo()
  assertApprox(leaseSeconds(info), 120, 1, 'lease')
  assertClose(info.endAt, Date.now() + 120_000, LEASE_SLACK_MS, 'endAt')
})

scenario('allowInternetAccess round-trips to getInfo', async () => {
  for (const allowed of [true, false]) {
    const sbx = await create({ allowInternetAccess: allowed, metadata: tag({ net: String(allowed) }) })
    const info = await sbx.getInfo()
    assert.equal(info.allowInternetAccess, allowed)
    assert.equal(info.state, 'running')
  }
})

scenario('create from an unknown template fails with 404', async () => {
  await rejects(create({ template: 'no-such-template-' + RUN }), SandboxError, 404, 'unknown template')
})

scenario('unsupported create options are refused with 400', async () => {
  const cases = {
    // CIDR rules are enforced (tests/e2b_network.rs); domain rules need an egress proxy.
    networkDomains: { network: { allowOut: ['example.com'] } },
    mcp: { mcp: { exa: { apiKey: 'x' } } },
    volumeMounts: { volumeMounts: { '/data': 'vol-' + RUN } },
    iam: { iam: { tokens: { aws: { audience: 'sts.amazonaws.com', tokenType: 'JWT-SVID' } } } },
  }
  for (const [option, opts] of Object.entries(cases)) {
    const metadata = tag({ option })
    await rejects(create({ metadata, ...opts }), SandboxError, 400, option)
    assert.deepEqual(await listAll({ query: { metadata } }), [], `${option}: nothing may be started`)
  }
})

scenario('list: filters, order, pagination, immediate updates', async () => {
  const before = new Date(Date.now() - 1000)
  const sbxs = []
  for (let i = 0; i < 3; i++) {
    sbxs.push(await create({ metadata: tag({ idx: String(i), note: 'a b&c=d' }) }))
    await sleep(20) // distinct start times, so the order below is defined
  }
  const infos = await Promise.all(sbxs.map((s) => s.getInfo()))
  const mine = { metadata: tag() }

  assert.deepEqual(sorted(ids(await listAll({ query: mine }))), sorted(ids(sbxs)))

  // Metadata: exact match on every pair, with characters that need encoding.
  assert.deepEqual(ids(await listAll({ query: { metadata: tag({ idx: '1' }) } })), [sbxs[1].sandboxId])
  assert.deepEqual(await listAll({ query: { metadata: { suite: RUN, idx: '1 ' } } }), [])
  assert.deepEqual(await listAll({ query: { metadata: { suite: RUN.slice(0, -1) } } }), [])
  assert.equal((await listAll({ query: { metadata: { suite: RUN, note: 'a b&c=d' } } })).length, 3)
  assert.deepEqual(await listAll({ query: { metadata: { suite: RUN, note: 'a b' } } }), [])
  const odd = await create({ metadata: tag({ 'k=1 &x é': 'v&1=2%+ü/?#' }) })
  assert.deepEqual(ids(await listAll({ query: { metadata: { suite: RUN, 'k=1 &x é': 'v&1=2%+ü/?#' } } })), [odd.sandboxId])
  assert.equal(await odd.kill(), true)

  // Listed items carry the same facts as getInfo.
  const listed = new Map((await listAll({ query: mine })).map((i) => [i.sandboxId, i]))
  for (const info of infos) {
    const item = listed.get(info.sandboxId)
    assert.ok(item, `${info.sandboxId} not listed`)
    assert.equal(item.templateId, 'base')
    assert.equal(item.state, 'running')
    assert.equal(item.cpuCount, 1)
    assert.equal(item.memoryMB, 512)
    assert.deepEqual(item.metadata, info.metadata)
    assert.equal(item.startedAt.getTime(), info.startedAt.getTime())
    assert.equal(item.endAt.getTime(), info.endAt.getTime())
  }

  // State filter, right after a pause.
  assert.equal(await sbxs[0].pause(), true)
  const running = await listAll({ query: { ...mine, state: ['running'] } })
  const paused = await listAll({ query: { ...mine, state: ['paused'] } })
  assert.deepEqual(sorted(ids(running)), sorted(ids(sbxs.slice(1))))
  assert.deepEqual(ids(paused), [sbxs[0].sandboxId])
  assert.equal(paused[0].state, 'paused')
  assert.deepEqual(sorted(ids(await listAll({ query: { ...mine, state: ['running', 'paused'] } }))), sorted(ids(sbxs)))

  // Template filter.
  assert.deepEqual(sorted(ids(await listAll({ query: { ...mine, template: 'base' } }))), sorted(ids(sbxs)))
  assert.deepEqual(await listAll({ query: { ...mine, template: 'other-' + RUN } }), [])

  // startedAfter.
  assert.deepEqual(sorted(ids(await listAll({ query: { ...mine, startedAfter: before } }))), sorted(ids(sbxs)))
  const afterAll = new Date(Math.max(...infos.map((i) => i.startedAt.getTime())) + 1000)
  assert.deepEqual(await listAll({ query: { ...mine, startedAfter: afterAll } }), [])
  const t0 = infos[0].startedAt.getTime()
  const t2 = infos[2].startedAt.getTime()
  assert.ok(t2 - t0 >= 2, 'start times must differ')
  const middle = new Date(Math.floor((t0 + t2) / 2))
  const got = ids(await listAll({ query: { ...mine, startedAfter: middle } }))
  assert.ok(!got.includes(sbxs[0].sandboxId) && got.includes(sbxs[2].sandboxId), `startedAfter middle: ${got}`)

  // Order across pages of one; no token on the last page.
  const byStart = [...infos].sort((a, b) => a.startedAt - b.startedAt).map((i) => i.sandboxId)
  for (const [order, expected] of [['asc', byStart], ['desc', [...byStart].reverse()], [undefined, [...byStart].reverse()]]) {
    const pager = Sandbox.list({ query: mine, limit: 1, order })
    const pages = []
    while (pager.hasNext) {
      pages.push(ids(await pager.nextItems()))
      assert.ok(pages.length <= 3, `order=${order}: more pages than sandboxes: ${JSON.stringify(pages)}`)
      assert.equal(pager.hasNext, pages.length < 3, `order=${order}: hasNext after page ${pages.length}`)
    }
    assert.deepEqual(pages, expected.map((i) => [i]), `order=${order}`)
  }

  // A page of two, then the rest through nextToken.
  const pager = Sandbox.list({ query: mine, limit: 2, order: 'asc' })
  assert.deepEqual(ids(await pager.nextItems()), byStart.slice(0, 2))
  assert.ok(pager.hasNext && pager.nextToken)
  const resumed = Sandbox.list({ query: mine, limit: 2, order: 'asc', nextToken: pager.nextToken })
  assert.deepEqual(ids(await resumed.nextItems()), byStart.slice(2))
  assert.equal(resumed.hasNext, false)

  // Kills show up at once.
  assert.equal(await sbxs[1].kill(), true)
  assert.deepEqual(sorted(ids(await listAll({ query: mine }))), sorted([sbxs[0].sandboxId, sbxs[2].sandboxId]))
})

scenario('list: limit bounds', async () => {
  await create()
  assert.equal((await Sandbox.list({ query: { metadata: tag() }, limit: 100 }).nextItems()).length, 1)
  await rejects(Sandbox.list({ limit: 101 }).nextItems(), SandboxError, 400, 'limit 101')
  await rejects(Sandbox.list({ limit: 0 }).nextItems(), SandboxError, 400, 'limit 0')
  await rejects(Sandbox.list({ order: 'sideways' }).nextItems(), SandboxError, 400, 'bad order')
})

scenario('setTimeout moves endAt both ways; refreshes only extend', async () => {
  const sbx = await create({ timeoutMs: 300_000 })
  await sbx.setTimeout(60_000)
  assertClose((await sbx.getInfo()).endAt, Date.now() + 60_000, LEASE_SLACK_MS, 'endAt after 60 s')
  await Sandbox.setTimeout(sbx.sandboxId, 600_000)
  const info = await sbx.getInfo()
  assertClose(info.endAt, Date.now() + 600_000, LEASE_SLACK_MS, 'endAt after 600 s')

  let res = await raw('POST', `/sandboxes/${sbx.sandboxId}/refreshes`, { body: { duration: 30 } })
  assert.equal(res.status, 204, res.text)
  assert.equal((await sbx.getInfo()).endAt.getTime(), info.endAt.getTime(), 'a short refresh must not shorten')
  res = await raw('POST', `/sandboxes/${sbx.sandboxId}/refreshes`, { body: { duration: 900 } })
  assert.equal(res.status, 204, res.text)
  assertClose((await sbx.getInfo()).endAt, Date.now() + 900_000, LEASE_SLACK_MS, 'refreshed endAt')

  await rejects(Sandbox.setTimeout(UNKNOWN_ID, 60_000), SandboxNotFoundError, undefined, 'unknown sandbox')
})

scenario('timeouts beyond the 24 h maximum are refused', async () => {
  await rejects(create({ timeoutMs: 86_401_000, metadata: tag({ role: 'too-long' }) }), SandboxError, 400, 'create')
  assert.deepEqual(await listAll({ query: { metadata: tag({ role: 'too-long' }) } }), [])
  const sbx = await create({ timeoutMs: 300_000 })
  await rejects(sbx.setTimeout(86_401_000), SandboxError, 400, 'setTimeout')
  assertApprox(leaseSeconds(await sbx.getInfo()), 300, 1, 'lease unchanged')
  await sbx.setTimeout(86_400_000)
  assertApprox(leaseSeconds(await sbx.getInfo()), 86_400, 5, 'lease at the maximum')
})

scenario('a lease that ends removes a running sandbox and keeps a paused one', async () => {
  const running = await create({ timeoutMs: 300_000, metadata: tag({ role: 'expiring' }) })
  const paused = await create({ timeoutMs: 2_000, metadata: tag({ role: 'kept' }) })
  assert.equal(await paused.pause(), true)
  await running.setTimeout(1000)
  // A paused sandbox's lease does not run: there is none to set.
  await rejects(paused.setTimeout(1000), SandboxError, 409, 'timeout of a paused sandbox')
  const query = { metadata: tag({ role: 'expiring' }) }
  const deadline = Date.now() + 30_000 // generous: the lease is 1 s
  while ((await listAll({ query })).length && Date.now() < deadline) await sleep(200)
  assert.deepEqual(await listAll({ query }), [], 'sandboxes still listed 30 s after a 1 s lease')
  await rejects(running.getInfo(), SandboxNotFoundError, undefined, 'expired getInfo')
  await rejects(Sandbox.connect(running.sandboxId), SandboxNotFoundError, undefined, 'expired connect')
  assert.equal(await running.kill(), false)
  assert.equal((await paused.getInfo()).state, 'paused', 'kept past its 2 s lease')
})

scenario('concurrent creates (more than the warm pool) all succeed', async () => {
  const metadata = tag({ role: 'burst' })
  const results = await Promise.allSettled(Array.from({ length: 8 }, () => create({ metadata })))
  const failed = results.filter((r) => r.status === 'rejected').map((r) => r.reason?.message)
  assert.deepEqual(failed, [], 'every create must succeed')
  const created = results.map((r) => r.value.sandboxId)
  assert.equal(new Set(created).size, 8)
  assert.deepEqual(sorted(ids(await listAll({ query: { metadata } }))), sorted(created))
  const killed = await Promise.all(created.map((id) => Sandbox.kill(id)))
  assert.deepEqual(killed, Array(8).fill(true))
  assert.deepEqual(await listAll({ query: { metadata } }), [])
})

scenario('pause, pause again, connect resumes', async () => {
  const sbx = await create({ timeoutMs: 300_000 })
  // A filesystem-only pause keeps the sandbox; connect boots it again.
  assert.equal(await sbx.pause({ keepMemory: false }), true)
  assert.equal((await sbx.getInfo()).state, 'paused')
  assert.equal((await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60_000 })).sandboxId, sbx.sandboxId)
  assert.equal((await sbx.getInfo()).state, 'running')

  assert.equal(await sbx.pause(), true)
  const info = await sbx.getInfo()
  assert.equal(info.state, 'paused')
  assert.deepEqual(ids(await listAll({ query: { metadata: tag(), state: ['paused'] } })), [sbx.sandboxId])
  assert.equal(await sbx.pause(), false, 'second pause (409) must answer false')
  assert.equal(await Sandbox.pause(sbx.sandboxId), false)

  const same = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60_000 })
  assert.equal(same.sandboxId, sbx.sandboxId)
  assert.equal(same.sandboxDomain, 'localhost')
  const after = await sbx.getInfo()
  assert.equal(after.state, 'running')
  assert.ok(after.endAt >= info.endAt, 'connect must not shorten the lease')
  assert.deepEqual(ids(await listAll({ query: { metadata: tag(), state: ['running'] } })), [sbx.sandboxId])

  assert.equal(await Sandbox.pause(sbx.sandboxId), true)
  assert.equal(await sbx.connect(), sbx)
  assert.equal((await sbx.getInfo()).state, 'running')
})

scenario('connect to a running sandbox only extends its lease', async () => {
  const sbx = await create({ timeoutMs: 600_000 })
  const before = await sbx.getInfo()
  const got = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60_000 })
  assert.equal(got.sandboxId, sbx.sandboxId)
  const info = await sbx.getInfo()
  assert.equal(info.state, 'running')
  assert.ok(
    Math.abs(info.endAt - before.endAt) <= 1000,
    `connect(60 s) moved endAt from ${before.endAt.toISOString()} to ${info.endAt.toISOString()}`
  )
  await Sandbox.connect(sbx.sandboxId, { timeoutMs: 900_000 })
  assertClose((await sbx.getInfo()).endAt, Date.now() + 900_000, LEASE_SLACK_MS, 'endAt')
  await rejects(Sandbox.connect(UNKNOWN_ID), SandboxNotFoundError, undefined, 'unknown sandbox')
})

scenario('connect answers 201 when it resumed, 200 when running', async () => {
  const sbx = await create({ timeoutMs: 300_000 })
  for (const route of ['/v2/sandboxes/{id}/connect', '/sandboxes/{id}/connect']) {
    const path = route.replace('{id}', sbx.sandboxId)
    let res = await raw('POST', path, { body: { timeout: 60 } })
    assert.equal(res.status, 200, `${path}: ${res.text}`)
    assert.equal(res.json().sandboxID, sbx.sandboxId)
    assert.equal(await sbx.pause(), true)
    res = await raw('POST', path, { body: { timeout: 60 } })
    assert.equal(res.status, 201, `${path}: ${res.text}`)
    assert.equal(res.json().sandboxID, sbx.sandboxId)
    assert.equal((await sbx.getInfo()).state, 'running')
  }
})

scenario('fork', async () => {
  assert.equal(typeof Sandbox.fork, 'function', 'e2b 2.51 has Sandbox.fork')
  const src = await create({ timeoutMs: 300_000, metadata: tag({ role: 'source' }) })
  const children = await src.fork({ count: 2, timeoutMs: 120_000 })
  for (const c of children) if (c instanceof Sandbox) track(c)
  assert.equal(children.length, 2)
  const errors = children.filter((c) => !(c instanceof Sandbox))
  assert.deepEqual(errors, [], `fork children failed: ${errors.map((e) => e.message)}`)
  const childIds = ids(children)
  assert.equal(new Set(childIds).size, 2)
  assert.ok(!childIds.includes(src.sandboxId))
  for (const c of children) {
    assert.match(c.sandboxId, SANDBOX_ID)
    assert.equal(c.sandboxDomain, 'localhost')
    const info = await c.getInfo()
    assert.equal(info.state, 'running')
    assert.equal(info.cpuCount, 1)
    assert.equal(info.memoryMB, 512)
    assertApprox(leaseSeconds(info), 120, 1, 'child lease')
  }
  assert.equal((await src.getInfo()).state, 'running')

  // Same tenant: listed for it (whole tenant; metadata inheritance is not asserted), hidden from
  // the other.
  const listed = ids(await listAll())
  for (const id of childIds) assert.ok(listed.includes(id), `${id} not listed`)
  const other = ids(await listAll({ apiKey: KEY_B }))
  for (const id of childIds) {
    assert.ok(!other.includes(id), `${id} visible to the other tenant`)
    await rejects(Sandbox.getInfo(id, { apiKey: KEY_B }), SandboxNotFoundError, undefined, 'other tenant getInfo')
  }

  const more = await Sandbox.fork(src.sandboxId, { count: 1, timeoutMs: 60_000 })
  for (const c of more) if (c instanceof Sandbox) track(c)
  assert.equal(more.length, 1)
  assert.ok(more[0] instanceof Sandbox, String(more[0]))
  assertApprox(leaseSeconds(await more[0].getInfo()), 60, 1, 'static fork lease')

  // Default fork lifetime: 15 s, as the API documents.
  const dflt = await src.fork()
  for (const c of dflt) if (c instanceof Sandbox) track(c)
  assert.equal(dflt.length, 1)
  assertApprox(leaseSeconds(await dflt[0].getInfo()), 15, 1, 'default fork lease')

  for (const c of children) assert.equal(await c.kill(), true)
  assert.equal((await src.getInfo()).state, 'running')
})

scenario('fork count outside 1..16 is refused with 400', async () => {
  const src = await create({ metadata: tag({ role: 'fork-bounds' }) })
  // e2b 2.51 does not check the count itself, so each of these reaches the gateway.
  for (const count of [17, 0, -1]) {
    const forked = src.fork({ count, timeoutMs: 30_000 })
    // Should it succeed after all, what it started is still cleaned up.
    forked.then((r) => r.forEach((c) => c instanceof Sandbox && track(c)), () => {})
    await rejects(forked, SandboxError, 400, `count ${count}`)
  }
  assert.deepEqual(ids(await listAll({ query: { metadata: tag() } })), [src.sandboxId])
  await rejects(Sandbox.fork(UNKNOWN_ID, { count: 1 }), SandboxNotFoundError, undefined, 'unknown sandbox')
})

scenario('snapshots: create, list, branch, delete', async () => {
  const src = await create({ metadata: tag({ role: 'snapshot-source' }) })
  const unrelated = await create({ metadata: tag({ role: 'unrelated' }) })
  const name = `snap-${RUN}`
  const snap = await src.createSnapshot({ name })
  trackSnapshot(snap.snapshotId)
  assert.match(snap.snapshotId, SNAPSHOT_ID)
  assert.deepEqual(snap.names, [name])
  assert.equal((await src.getInfo()).state, 'running')

  const everything = await listSnapshotsAll()
  const mine = everything.filter((s) => s.snapshotId === snap.snapshotId)
  assert.equal(mine.length, 1, JSON.stringify(snapshotIds(everything)))
  assert.deepEqual(mine[0].names, [name])
  for (const s of everything) {
    for (const n of s.names) assert.ok(!n.startsWith(NAMESPACE_A + '/'), `namespace leaked in ${JSON.stringify(s)}`)
  }

  assert.deepEqual(snapshotIds(await listSnapshotsAll({ sandboxId: src.sandboxId })), [snap.snapshotId])
  assert.deepEqual(snapshotIds(await src.listSnapshots().nextItems()), [snap.snapshotId])
  assert.deepEqual(await listSnapshotsAll({ sandboxId: unrelated.sandboxId }), [])
  assert.deepEqual(snapshotIds(await listSnapshotsAll({ name })), [snap.snapshotId])
  assert.deepEqual(await listSnapshotsAll({ name: name + '-nope' }), [])

  const snap2 = await Sandbox.createSnapshot(src.sandboxId, { name: name + '-2' })
  trackSnapshot(snap2.snapshotId)
  assert.notEqual(snap2.snapshotId, snap.snapshotId)
  assert.deepEqual(snap2.names, [name + '-2'])
  const pager = Sandbox.listSnapshots({ sandboxId: src.sandboxId, limit: 1 })
  const page1 = snapshotIds(await pager.nextItems())
  assert.equal(pager.hasNext, true)
  const page2 = snapshotIds(await pager.nextItems())
  assert.equal(pager.hasNext, false, 'X-Next-Token must be absent on the last page')
  assert.deepEqual([...page1, ...page2], [snap2.snapshotId, snap.snapshotId])

  const child = await create({ template: snap.snapshotId, metadata: tag({ role: 'from-snapshot' }) })
  assert.match(child.sandboxId, SANDBOX_ID)
  assert.ok(![src.sandboxId, unrelated.sandboxId].includes(child.sandboxId))
  const cinfo = await child.getInfo()
  assert.equal(cinfo.state, 'running')
  assert.equal(cinfo.templateId, snap.snapshotId)
  assert.deepEqual(cinfo.metadata, tag({ role: 'from-snapshot' }))
  assert.ok(ids(await listAll({ query: { template: snap.snapshotId } })).includes(child.sandboxId))
  assert.equal(await child.kill(), true)

  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
  assert.ok(!snapshotIds(await listSnapshotsAll()).includes(snap.snapshotId))
  assert.deepEqual(snapshotIds(await listSnapshotsAll({ sandboxId: src.sandboxId })), [snap2.snapshotId])
  assert.equal(await Sandbox.deleteSnapshot(snap2.snapshotId), true)
  await rejects(create({ template: snap.snapshotId }), SandboxError, undefined, 'branch from a deleted snapshot')
  await rejects(Sandbox.createSnapshot(UNKNOWN_ID, { name: 'x' }), SandboxNotFoundError, undefined, 'unknown sandbox')
})

scenario("snapshot names must fit the tenant's namespace", async () => {
  const src = await create({ metadata: tag({ role: 'snapshot-names' }) })
  const room = MAX_CHECKPOINT_NAME - NAMESPACE_A.length - 1
  const longest = (`n${RUN}-` + 'x'.repeat(room)).slice(0, room)
  const snap = await src.createSnapshot({ name: longest })
  trackSnapshot(snap.snapshotId)
  assert.deepEqual(snap.names, [longest])
  await rejects(src.createSnapshot({ name: longest + 'y' }), SandboxError, 400, 'name one too long')
  assert.deepEqual(snapshotIds(await listSnapshotsAll({ sandboxId: src.sandboxId })), [snap.snapshotId])
})

scenario('metrics', async () => {
  const sbx = await create()
  for (const metrics of [await sbx.getMetrics(), await Sandbox.getMetrics(sbx.sandboxId)]) {
    assert.equal(metrics.length, 1, JSON.stringify(metrics))
    const m = metrics[0]
    assert.equal(m.cpuCount, 1)
    assert.ok(m.memUsed > 0, `memUsed ${m.memUsed}`)
    assert.equal(m.memTotal, 512 * MIB)
    assert.ok(m.diskUsed > 0, `diskUsed ${m.diskUsed}`)
    assert.ok(m.diskTotal >= m.diskUsed)
    assert.ok(m.cpuUsedPct >= 0)
    assertClose(m.timestamp, Date.now(), CLOCK_SLACK_MS, 'metrics timestamp')
  }
  // A window from just before the start until after now holds the (single, current) sample. The
  // SDK rounds `start` to the nearest second, so a start of exactly startedAt may round past a
  // sample taken in the same second: begin a second earlier.
  const startedAt = (await sbx.getInfo()).startedAt
  const start = new Date(startedAt.getTime() - 1000)
  assert.equal((await sbx.getMetrics({ start, end: new Date(Date.now() + 60_000) })).length, 1)
  const later = Date.now() + 3_600_000
  assert.deepEqual(await sbx.getMetrics({ start: new Date(later), end: new Date(later + 3_600_000) }), [])
  await rejects(Sandbox.getMetrics(UNKNOWN_ID), SandboxNotFoundError, undefined, 'unknown sandbox')
})

scenario('kill', async () => {
  const sbx = await create()
  const paused = await create()
  assert.equal(await paused.pause(), true)
  assert.equal(await sbx.kill(), true)
  assert.equal(await sbx.kill(), false, 'second kill (404) must answer false')
  assert.equal(await Sandbox.kill(paused.sandboxId), true)
  assert.equal(await Sandbox.kill(paused.sandboxId), false)
  for (const s of [sbx, paused]) {
    await rejects(Sandbox.getInfo(s.sandboxId), SandboxNotFoundError, undefined, 'killed sandbox')
  }
  assert.deepEqual(await listAll({ query: { metadata: tag() } }), [])
})

scenario('tenants are isolated', async () => {
  const a = await create({ metadata: tag({ tenant: 'a' }) })
  const snap = await a.createSnapshot({ name: `iso-${RUN}` })
  trackSnapshot(snap.snapshotId)
  const b = await create({ metadata: tag({ tenant: 'b' }) }, KEY_B)
  const asB = { apiKey: KEY_B }

  await rejects(Sandbox.getInfo(a.sandboxId, asB), SandboxNotFoundError, undefined, 'B getInfo')
  assert.equal(await Sandbox.kill(a.sandboxId, asB), false, 'B kill must answer false')
  await rejects(Sandbox.setTimeout(a.sandboxId, 30_000, asB), SandboxNotFoundError, undefined, 'B setTimeout')
  await rejects(Sandbox.pause(a.sandboxId, asB), SandboxNotFoundError, undefined, 'B pause')
  await rejects(Sandbox.connect(a.sandboxId, asB), SandboxNotFoundError, undefined, 'B connect')
  await rejects(Sandbox.fork(a.sandboxId, { ...asB, count: 1 }), SandboxNotFoundError, undefined, 'B fork')
  await rejects(Sandbox.getMetrics(a.sandboxId, asB), SandboxNotFoundError, undefined, 'B getMetrics')
  await rejects(Sandbox.createSnapshot(a.sandboxId, { ...asB, name: 'steal' }), SandboxNotFoundError, undefined, 'B createSnapshot')
  const bList = ids(await listAll(asB))
  assert.ok(!bList.includes(a.sandboxId) && bList.includes(b.sandboxId))
  assert.deepEqual(ids(await listAll({ ...asB, query: { metadata: tag() } })), [b.sandboxId])

  assert.ok(!snapshotIds(await listSnapshotsAll(asB)).includes(snap.snapshotId))
  assert.deepEqual(await listSnapshotsAll({ ...asB, sandboxId: a.sandboxId }), [])
  assert.deepEqual(await listSnapshotsAll({ ...asB, name: `iso-${RUN}` }), [])
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId, asB), false, "B deleting A's snapshot must answer false")
  await rejects(create({ template: snap.snapshotId, metadata: tag({ tenant: 'b-steal' }) }, KEY_B), SandboxError, undefined, "B branching from A's snapshot")

  await rejects(Sandbox.getInfo(b.sandboxId), SandboxNotFoundError, undefined, 'A getInfo of B')
  assert.equal(await Sandbox.kill(b.sandboxId), false)
  assert.ok(!ids(await listAll()).includes(b.sandboxId))

  const info = await Sandbox.getInfo(a.sandboxId)
  assert.equal(info.state, 'running')
  assert.deepEqual(info.metadata, tag({ tenant: 'a' }))
  assertApprox(leaseSeconds(info), 300, 10, "A's lease untouched")
  assert.equal((await Sandbox.getInfo(b.sandboxId, asB)).state, 'running')
  assert.deepEqual(snapshotIds(await listSnapshotsAll({ sandboxId: a.sandboxId })), [snap.snapshotId])
})

scenario('a wrong key is refused with AuthenticationError', async () => {
  const sbx = await create()
  const bad = { apiKey: wrongKey() }
  await rejects(Sandbox.create({ ...bad, metadata: tag({ role: 'wrong-key' }) }), AuthenticationError, undefined, 'create')
  await rejects(Sandbox.list(bad).nextItems(), AuthenticationError, undefined, 'list')
  await rejects(Sandbox.getInfo(sbx.sandboxId, bad), AuthenticationError, undefined, 'getInfo')
  await rejects(Sandbox.kill(sbx.sandboxId, bad), AuthenticationError, undefined, 'kill')
  await rejects(Sandbox.listSnapshots(bad).nextItems(), AuthenticationError, undefined, 'listSnapshots')
  assert.equal((await sbx.getInfo()).state, 'running')
  assert.deepEqual(ids(await listAll({ query: { metadata: tag() } })), [sbx.sandboxId])
})

// Checks of documented SDK/API behaviour the gateway is known to have differed on; last, so that a
// failure here does not hide the scenarios above.

scenario('list: startedAfter is "at or after" (inclusive)', async () => {
  const sbx = await create()
  const info = await sbx.getInfo()
  const got = ids(await listAll({ query: { metadata: tag(), startedAfter: info.startedAt } }))
  assert.deepEqual(
    got,
    [sbx.sandboxId],
    `startedAfter=${info.startedAt.toISOString()} (== startedAt of ${sbx.sandboxId}) must include that sandbox`
  )
})

scenario('listSnapshots: the name filter takes a snapshot ID', async () => {
  const src = await create({ metadata: tag({ role: 'snapshot-by-id' }) })
  const snap = await src.createSnapshot({ name: `byid-${RUN}` })
  trackSnapshot(snap.snapshotId)
  assert.deepEqual(snapshotIds(await listSnapshotsAll({ name: `byid-${RUN}` })), [snap.snapshotId])
  assert.deepEqual(
    snapshotIds(await listSnapshotsAll({ name: snap.snapshotId })),
    [snap.snapshotId],
    `GET /snapshots?name=${snap.snapshotId} must find that snapshot`
  )
})

// ---------------------------------------------------------------------------------------------

async function main() {
  const missing = [
    ['E2B_API_URL', API_URL],
    ['E2B_API_KEY', KEY_A],
    ['E2B_OTHER_API_KEY', KEY_B],
  ].filter(([, v]) => !v)
  if (missing.length) {
    console.error(`set ${missing.map(([n]) => n).join(', ')} (see tests/e2b/run.sh)`)
    process.exit(2)
  }
  assert.notEqual(KEY_A, KEY_B, 'E2B_API_KEY and E2B_OTHER_API_KEY must be different tenants')

  let passed = 0
  for (const { name, fn } of scenarios) {
    const started = Date.now()
    let failure
    try {
      await fn()
    } catch (e) {
      failure = e
    }
    const cleanupErrors = await cleanup()
    if (!failure && cleanupErrors.length) failure = new Error('cleanup failed: ' + cleanupErrors.join('; '))
    if (failure) {
      console.error(`not ok - ${name}`)
      console.error(failure?.stack ?? String(failure))
      if (cleanupErrors.length) console.error('cleanup also failed: ' + cleanupErrors.join('; '))
      console.log(`${passed} passed, 1 failed`)
      process.exit(1)
    }
    passed++
    console.log(`ok - ${name} (${Date.now() - started} ms)`)
  }
  console.log(`${passed} passed, 0 failed`)
}

await main()
