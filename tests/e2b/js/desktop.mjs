// Computer use with the unmodified JS SDK @e2b/desktop 2.4.0 against the gateway in the domain
// mode (tests/desktop.rs): a desktop sandbox, a PNG screenshot of the screen's size, the mouse,
// typing into a launched terminal (the command it typed ran), and the stream's noVNC page and
// WebSocket bridge reached at its URL through the gateway.

import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/desktop'
import { runScenarios } from './harness.mjs'

let desktop

// Width and height from a PNG's IHDR chunk.
function pngSize(bytes) {
  const b = Buffer.from(bytes)
  assert.equal(b.subarray(0, 8).toString('hex'), '89504e470d0a1a0a', 'a PNG')
  return [b.readUInt32BE(16), b.readUInt32BE(20)]
}

async function eventually(what, check, timeoutMs = 20_000) {
  const deadline = Date.now() + timeoutMs
  let last
  while (Date.now() < deadline) {
    try {
      last = await check()
      if (last) return last
    } catch (e) {
      last = e
    }
    await new Promise((r) => setTimeout(r, 300))
  }
  assert.fail(`${what}: ${last}`)
}

const scenarios = [
  {
    name: 'a screenshot is a PNG of the screen',
    fn: async () => {
      assert.deepEqual(pngSize(await desktop.screenshot()), [1024, 768])
      assert.deepEqual(await desktop.getScreenSize(), { width: 1024, height: 768 })
    },
  },
  {
    name: 'the mouse moves where it is told',
    fn: async () => {
      await desktop.moveMouse(123, 321)
      assert.deepEqual(await desktop.getCursorPosition(), { x: 123, y: 321 })
      await desktop.drag([200, 200], [260, 240])
      assert.deepEqual(await desktop.getCursorPosition(), { x: 260, y: 240 })
    },
  },
  {
    name: 'typing reaches a launched terminal',
    fn: async () => {
      await desktop.launch('xfce4-terminal')
      await eventually('the terminal has the focus', async () =>
        (await desktop.getWindowTitle(await desktop.getCurrentWindowId())).includes('Terminal'))
      await desktop.write('echo typed-from-js $((6*7)) > /tmp/js.txt', { chunkSize: 10, delayInMs: 5 })
      await desktop.press('enter')
      await eventually('the typed command ran', async () =>
        (await desktop.commands.run('cat /tmp/js.txt 2>/dev/null || true')).stdout.trim() === 'typed-from-js 42')
      await desktop.commands.run('pkill -x xfce4-terminal || true')
    },
  },
  {
    name: 'the stream is served at its URL',
    fn: async () => {
      await desktop.stream.start()
      const url = desktop.stream.getUrl()
      assert.ok(url.startsWith(`https://6080-${desktop.sandboxId}.`), url)
      const page = await fetch(url)
      assert.equal(page.status, 200)
      assert.match(await page.text(), /noVNC/)
      // noVNC's WebSocket bridge answers an upgrade through the gateway with the VNC
      // server's greeting.
      const ws = new WebSocket(url.replace('https://', 'wss://').replace(/\/vnc\.html.*/, '/websockify'), ['binary'])
      ws.binaryType = 'arraybuffer'
      const greeting = await new Promise((resolve, reject) => {
        ws.onmessage = (m) => resolve(Buffer.from(m.data).toString('latin1'))
        ws.onerror = (e) => reject(new Error(`websocket: ${e.message ?? e.type}`))
        setTimeout(() => reject(new Error('no greeting')), 15_000)
      })
      ws.close()
      assert.match(greeting, /^RFB 003\.00\d\n/)
      await desktop.stream.stop()
    },
  },
]

async function main() {
  desktop = await Sandbox.create({ timeoutMs: 600_000 })
  let failed = 1
  try {
    failed = await runScenarios(scenarios)
  } finally {
    await desktop.kill().catch(() => undefined)
  }
  process.exit(failed ? 1 : 0)
}

await main()
