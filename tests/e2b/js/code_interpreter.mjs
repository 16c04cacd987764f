// Drives the gateway's code interpreter with the unmodified e2b JS SDK for it
// (@e2b/code-interpreter@2.8.0 on e2b@2.51.0), with its defaults (template
// `code-interpreter-v1`): runCode in each language, results, charts, DataFrames, contexts,
// env vars, timeouts and interrupts, a non-string `code`, reconnects and a sandbox killed
// mid-run.
//
//   E2B_API_URL=... E2B_API_KEY=... E2B_SANDBOX_URL=<gateway URL> node tests/e2b/js/code_interpreter.mjs
//   (or E2B_DOMAIN=<domain> for the domain mode)
//
// Scenarios run one after another; the first failure is printed and the process exits 1. The
// last line is `N passed, M failed`.

import assert from 'node:assert/strict'
import { setTimeout as sleep } from 'node:timers/promises'

import { NotFoundError, Sandbox, SandboxError, TimeoutError } from '@e2b/code-interpreter'

import { rejects, runScenarios } from './harness.mjs'

const QUICK = process.env.CI_QUICK === '1'

let sbx

const scenarios = []
const scenario = (name, fn, { quick = true } = {}) => scenarios.push({ name, fn, quick })

scenario('run python, keep state, count executions', async () => {
  assert.equal((await sbx.runCode('x =1; x')).text, '1')
  const e = await sbx.runCode('x += 1; x')
  assert.equal(e.text, '2')
  assert.ok(e.executionCount >= 2)
  assert.equal((await sbx.runCode('!pwd')).logs.stdout.join(), '/home/user\r\n')
})

scenario('callbacks and streams', async () => {
  const out = []
  const err = []
  const results = []
  const errors = []
  const e = await sbx.runCode('import sys\nprint("hello")\nprint("oops", file=sys.stderr)\n7', {
    onStdout: (m) => out.push(m),
    onStderr: (m) => err.push(m),
    onResult: (r) => results.push(r),
  })
  assert.deepEqual(e.logs.stdout, ['hello\n'])
  assert.deepEqual(out.map((m) => m.line), ['hello\n'])
  assert.deepEqual(err.map((m) => m.line), ['oops\n'])
  assert.equal(results.length, 1)
  assert.equal(results[0].text, '7')
  const failed = await sbx.runCode('xyz', { onError: (x) => errors.push(x) })
  assert.equal(errors.length, 1)
  assert.equal(failed.error.name, 'NameError')
})

scenario('display data, charts and DataFrames', async () => {
  const plot = await sbx.runCode(`
import numpy as np
import matplotlib.pyplot as plt
x = np.linspace(0, 20, 100)
plt.plot(x, np.sin(x))
plt.show()
`)
  assert.ok(plot.results[0].png)
  assert.ok(plot.results[0].text)
  assert.deepEqual(plot.results[0].extra, {})
  const bar = await sbx.runCode(`
import matplotlib.pyplot as plt
plt.bar(['Author A', 'Author B'], [100, 200], label='Books Sold')
plt.xlabel('Authors'); plt.title('Book Sales'); plt.show()
`)
  const chart = bar.results[0].chart
  assert.equal(chart.type, 'bar')
  assert.equal(chart.title, 'Book Sales')
  assert.deepEqual(chart.elements.map((e) => e.value), [100, 200])
  assert.deepEqual(chart.elements.map((e) => e.group), ['Books Sold', 'Books Sold'])
  const df = await sbx.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2, 3], 'n': [1.0, float('nan'), 3.0]})")
  assert.deepEqual(df.results[0].data.a, [1, 2, 3])
  assert.deepEqual(df.results[0].data.n, [1, null, 3])
  assert.ok(df.results[0].html.includes('<table'))
})

scenario('javascript, typescript, r and bash', async () => {
  assert.deepEqual((await sbx.runCode("console.log('Hello World!')", { language: 'js' })).logs.stdout, ['Hello World!\n'])
  const esm = await sbx.runCode("import { readFileSync } from 'fs'\nconsole.log(typeof readFileSync)", { language: 'js' })
  assert.deepEqual(esm.logs.stdout, ['function\n'])
  assert.equal((await sbx.runCode("await Promise.resolve('Hello World!')", { language: 'js' })).text, 'Hello World!')
  await sbx.runCode('x = 1', { language: 'javascript' })
  assert.equal((await sbx.runCode('x += 1; x', { language: 'javascript' })).text, '2')
  const ts = await sbx.runCode('const message: string = "Hello World!"\nconsole.log(message)', { language: 'ts' })
  assert.deepEqual(ts.logs.stdout, ['Hello World!\n'])
  assert.deepEqual((await sbx.runCode('print("Hello, World!")', { language: 'r' })).logs.stdout, ['[1] "Hello, World!"\n'])
  assert.deepEqual((await sbx.runCode('echo Hello', { language: 'bash' })).logs.stdout, ['Hello\n'])
  assert.equal((await sbx.runCode('process.cwd()', { language: 'ts' })).text, '/home/user')
  const java = await sbx.runCode('System.out.println("Hello, World!")', { language: 'java' })
  assert.equal(java.logs.stdout.join(''), 'Hello, World!\n')
})

scenario('contexts', async () => {
  const langs = (await sbx.listCodeContexts()).map((c) => c.language)
  assert.ok(langs.includes('python') && langs.includes('javascript'))
  const ctx = await sbx.createCodeContext({ cwd: '/root' })
  const last = (await sbx.listCodeContexts()).at(-1)
  assert.deepEqual([last.id, last.language, last.cwd], [ctx.id, 'python', '/root'])
  await sbx.runCode('x = 1')
  const isolated = await sbx.runCode('x', { context: ctx })
  assert.equal(isolated.error.value, "name 'x' is not defined")
  await sbx.runCode('y = 2', { context: ctx })
  await sbx.restartCodeContext(ctx)
  assert.equal((await sbx.runCode('y', { context: ctx })).error.name, 'NameError')
  await sbx.removeCodeContext(ctx)
  assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctx.id))
  await rejects(sbx.runCode('1', { context: ctx }), NotFoundError, 'a removed context')
  // The SDK's own call with the context and language in the wrong place sends an object as
  // `code`; the server refuses it (422) rather than running something.
  await rejects(sbx.runCode({ context: ctx, language: 'python' }), SandboxError, 'an object as code')
  await rejects(sbx.runCode('1', { language: 'cobol' }), SandboxError, 'an unknown language')
})

scenario('env vars per run and per sandbox', async () => {
  const read = "import os; os.getenv('FOO', 'default')"
  assert.equal((await sbx.runCode(read, { envs: { FOO: 'bar' } })).text, 'bar')
  assert.equal((await sbx.runCode(read)).text, 'default')
  const js = "process.env.FOO || 'default'"
  assert.equal((await sbx.runCode(js, { language: 'js', envs: { FOO: 'bar' } })).text, 'bar')
  assert.equal((await sbx.runCode(js, { language: 'js' })).text, 'default')
  const own = await Sandbox.create({ envs: { TEST_ENV_VAR: 'supertest' }, timeoutMs: 120_000 })
  try {
    assert.equal((await own.runCode("import os; os.getenv('TEST_ENV_VAR')")).text, 'supertest')
    assert.equal((await own.runCode('process.env.TEST_ENV_VAR', { language: 'js' })).text, 'supertest')
  } finally {
    await own.kill()
  }
}, { quick: false })

scenario('a timeout interrupts the kernel', async () => {
  await rejects(sbx.runCode('import time; time.sleep(300)', { timeoutMs: 3_000 }), TimeoutError, 'sleep with a 3 s timeout')
  await sleep(5_000)
  assert.equal((await sbx.runCode('1 + 1', { timeoutMs: 10_000 })).text, '2')
}, { quick: false })

scenario('reconnect', async () => {
  await sbx.runCode("seen = 'again'")
  const again = await Sandbox.connect(sbx.sandboxId)
  assert.equal((await again.runCode('seen')).text, 'again')
})

scenario('a sandbox killed mid-run', async () => {
  const own = await Sandbox.create({ timeoutMs: 120_000 })
  setTimeout(() => own.kill(), 2_000)
  const started = Date.now()
  const e = await rejects(own.runCode('import time; time.sleep(300)', { timeoutMs: 300_000 }), TimeoutError, 'killed')
  assert.match(e.message, /sandbox was killed while the request was in progress/)
  assert.ok(Date.now() - started < 30_000)
}, { quick: false })

async function main() {
  sbx = await Sandbox.create({ timeoutMs: 600_000 })
  let failed = 1
  try {
    failed = await runScenarios(
      scenarios.map((s) => ({
        ...s,
        skip: QUICK && !s.quick ? 'quick run, the domain mode repeats the core only' : undefined,
      })),
    )
  } finally {
    await sbx.kill().catch(() => undefined)
  }
  process.exit(failed ? 1 : 0)
}

await main()
