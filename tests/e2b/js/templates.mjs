// Template builds with the unmodified e2b JS SDK (e2b@2.51.0) through the gateway: a build
// from `base` with files, commands, environment, working directory and a start command, a
// sandbox made from it, a failing build, the cache and background builds. Run by
// tests/e2b_templates.rs with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set.

import assert from 'node:assert/strict'
import { mkdtempSync, mkdirSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'

import { BuildError, Sandbox, Template, waitForPort } from 'e2b'

import { rejects, runScenarios } from './harness.mjs'

const unique = (p) => `${p}-${Math.random().toString(16).slice(2, 10)}`

const context = mkdtempSync(join(tmpdir(), 'tpl-'))
mkdirSync(join(context, 'site', 'sub'), { recursive: true })
writeFileSync(join(context, 'site', 'index.txt'), 'served\n')
writeFileSync(join(context, 'site', 'sub', 'x.txt'), 'x\n')

async function run(sbx, cmd, opts) {
  return (await sbx.commands.run(cmd, opts)).stdout.trim()
}

const scenarios = [
  {
    name: 'a build from base makes the sandboxes it describes',
    fn: async () => {
      const logs = []
      const t = Template({ fileContextPath: context })
        .fromTemplate('base')
        .copy('site', '/home/user/site')
        .runCmd('echo js-built > /home/user/built && echo from-js-stdout')
        .runCmd('id -u > /root-id', { user: 'root' })
        .setEnvs({ MODE: 'js' })
        .setWorkdir('/home/user/site')
        .setStartCmd('python3 -m http.server 8002', waitForPort(8002))
      const info = await Template.build(t, unique('js-every'), { onBuildLogs: (e) => logs.push(e.message) })
      assert.ok(logs.some((m) => m.endsWith('[stdout]: from-js-stdout')), logs.join('\n'))
      const sbx = await Sandbox.create(info.name, { timeoutMs: 120_000 })
      try {
        assert.equal(await run(sbx, 'cat /home/user/built'), 'js-built')
        assert.equal(await run(sbx, 'cat /root-id'), '0')
        assert.equal(await run(sbx, 'cat sub/x.txt'), 'x')
        assert.equal(await run(sbx, 'pwd'), '/home/user/site')
        assert.equal(await run(sbx, 'echo $MODE'), 'js')
        assert.equal(await run(sbx, 'stat -c %U /home/user/site/index.txt'), 'user')
        assert.equal(await run(sbx, 'curl -s --max-time 5 http://127.0.0.1:8002/index.txt'), 'served')
      } finally {
        await sbx.kill()
      }
    },
  },
  {
    name: 'a failing step fails the build with its message',
    fn: async () => {
      const t = Template().fromTemplate('base').runCmd('exit 4')
      const e = await rejects(Template.build(t, unique('js-fails')), BuildError, 'failing build')
      assert.match(e.message, /exit status 4/)
    },
  },
  {
    name: 'an unchanged rebuild is cached, and background builds report their state',
    fn: async () => {
      const name = unique('js-cached')
      const t = Template().fromTemplate('base').runCmd('sleep 1 && echo once > /home/user/once')
      await Template.build(t, name)
      const logs = []
      const began = Date.now()
      await Template.build(t, name, { onBuildLogs: (e) => logs.push(e.message) })
      assert.ok(logs.some((m) => m.startsWith('CACHED')), logs.join('\n'))
      assert.ok(Date.now() - began < 5_000, `took ${Date.now() - began} ms`)
      const bg = await Template.buildInBackground(Template().fromTemplate('base').runCmd('sleep 1'), unique('js-bg'))
      let s = await Template.getBuildStatus(bg)
      assert.equal(s.status, 'building')
      const deadline = Date.now() + 120_000
      while (s.status === 'building' && Date.now() < deadline) {
        await sleep(200)
        s = await Template.getBuildStatus(bg)
      }
      assert.equal(s.status, 'ready')
      assert.ok(await Template.exists(bg.name))
      assert.ok(!(await Template.exists(unique('js-missing'))))
    },
  },
]

process.exitCode = await runScenarios(scenarios)
