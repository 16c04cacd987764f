// Template builds `fromImage` with the unmodified e2b JS SDK (e2b@2.51.0): an image pulled
// anonymously from a plain registry and one behind TLS with a password, each the base of a
// sandbox. Run by tests/e2b_templates.rs with the registries in IMAGE_PLAIN, IMAGE_AUTH,
// REGISTRY_USER and REGISTRY_PASSWORD.

import assert from 'node:assert/strict'

import { BuildError, Sandbox, Template } from 'e2b'

import { rejects, runScenarios } from './harness.mjs'

const unique = (p) => `${p}-${Math.random().toString(16).slice(2, 10)}`
const env = process.env

async function builtAndRun(template, cmd) {
  const info = await Template.build(template, unique('js-image'))
  const sbx = await Sandbox.create(info.name, { timeoutMs: 60_000 })
  try {
    return (await sbx.commands.run(cmd)).stdout.trim()
  } finally {
    await sbx.kill()
  }
}

const scenarios = [
  {
    name: 'an image from a plain registry is the base of a build',
    fn: async () => {
      const t = Template().fromImage(env.IMAGE_PLAIN).runCmd('echo $IMPORTED > /home/user/imported')
      assert.equal(await builtAndRun(t, 'cat /home/user/imported; id -un; ls /opt/a'), 'yes\nuser\nnew.txt')
    },
  },
  {
    name: 'an image behind a password is pulled with it, and refused without',
    fn: async () => {
      const creds = { username: env.REGISTRY_USER, password: env.REGISTRY_PASSWORD }
      const t = Template().fromImage(env.IMAGE_AUTH, creds).runCmd('echo js > /home/user/from')
      assert.equal(await builtAndRun(t, 'cat /home/user/from'), 'js')
      const wrong = Template().fromImage(env.IMAGE_AUTH, { ...creds, password: 'nope' }).runCmd('true')
      const e = await rejects(Template.build(wrong, unique('js-denied'), { skipCache: true }), BuildError, 'wrong password')
      assert.match(e.message, /authoriz|401/i)
    },
  },
]

process.exitCode = await runScenarios(scenarios)
