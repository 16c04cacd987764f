// What the scenario programs share: a rejection check, and the runner that prints one
// `ok - name` / `not ok - name` line per scenario (tests/common/scenarios.rs reads them).

import assert from 'node:assert/strict'

// Awaits `promise`, which must reject (with an instance of `cls`, when given); the error.
export async function rejects(promise, cls, what) {
  try {
    await promise
  } catch (e) {
    if (cls) assert.ok(e instanceof cls, `${what}: expected ${cls.name}, got ${e?.constructor?.name}: ${e}`)
    return e
  }
  assert.fail(`${what}: expected a rejection`)
}

// Runs `scenarios` ({ name, fn, skip }) in order and stops at the first failure; `fn` may
// return a note for its line, `skip` says why a scenario does not run. How many failed.
export async function runScenarios(scenarios) {
  let passed = 0
  let failed = 0
  for (const { name, fn, skip } of scenarios) {
    if (skip) {
      console.log(`ok - ${name} # skipped: ${skip}`)
      continue
    }
    const started = Date.now()
    try {
      const note = await fn()
      passed++
      console.log(`ok - ${name} (${Date.now() - started} ms)${note ? ` # ${note}` : ''}`)
    } catch (e) {
      failed++
      console.error(`not ok - ${name}`)
      console.error(e?.stack ?? String(e))
      break
    }
  }
  console.log(`${passed} passed, ${failed} failed`)
  return failed
}
