'use strict';
// sandbox-gateway's JavaScript and TypeScript kernel: a Jupyter kernel (messaging protocol
// 5.3, over ZeroMQ, `ipc` or `tcp` as the connection file says) on Node.js. Code runs in this
// process's own global scope through V8's REPL mode (the inspector's `Runtime.evaluate` with
// `replMode`), which gives a notebook what it needs: state kept between cells, `let`/`const`
// declared again when a cell is run again, top-level `await`, and the last expression's value
// as the cell's result. TypeScript has its types stripped (sucrase); static `import`
// statements become dynamic imports resolved from the working directory. SIGINT stops
// running code (the cell ends with an error, the state stays); a cell waiting on a promise is
// given up instead.
//
// Usage: node kernel.js CONNECTION_FILE   (SANDBOX_GATEWAY_KERNEL_LANGUAGE=typescript for TS)

const crypto = require('crypto');
const fs = require('fs');
const inspector = require('inspector');
const Module = require('module');
const path = require('path');
const url = require('url');
const util = require('util');
const vm = require('vm');

const zmq = require('zeromq');
const acorn = require('acorn');

const LANGUAGE = process.env.SANDBOX_GATEWAY_KERNEL_LANGUAGE === 'typescript' ? 'typescript' : 'javascript';
const PROTOCOL = '5.3';
const DELIMITER = '<IDS|MSG>';
// Names this kernel keeps in the global scope, out of the user's way.
const EVAL = Symbol.for('sandbox-gateway.eval');
const IMPORT = Symbol.for('sandbox-gateway.import');
const DISPLAY = Symbol.for('sandbox-gateway.display');
// Output waiting for the socket beyond this is dropped (a tight loop that prints without
// yielding would otherwise grow this process until the sandbox's memory limit ends it).
const MAX_QUEUED_BYTES = 64 << 20;

const conn = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const key = conn.key || '';
const session = crypto.randomUUID();

function endpoint(port) {
  return conn.transport === 'ipc' ? `ipc://${conn.ip}-${port}` : `tcp://${conn.ip}:${port}`;
}

function sign(parts) {
  if (!key) return '';
  const h = crypto.createHmac('sha256', key);
  for (const p of parts) h.update(p);
  return h.digest('hex');
}

function header(msgType) {
  return {
    msg_id: crypto.randomUUID(),
    username: 'kernel',
    session,
    date: new Date().toISOString(),
    msg_type: msgType,
    version: PROTOCOL,
  };
}

/** A message from its wire frames, or null when it is malformed or not signed with our key. */
function decode(frames) {
  const at = frames.findIndex((f) => f.toString() === DELIMITER);
  if (at < 0 || frames.length < at + 6) return null;
  const parts = frames.slice(at + 2, at + 6);
  const expected = Buffer.from(sign(parts));
  const got = Buffer.from(frames[at + 1]);
  if (key && (expected.length !== got.length || !crypto.timingSafeEqual(expected, got))) return null;
  try {
    const [hdr, parent, metadata, content] = parts.map((p) => JSON.parse(p.toString()));
    return { ids: frames.slice(0, at), header: hdr, parent_header: parent, metadata, content };
  } catch {
    return null;
  }
}

function encode(ids, msgType, parent, content) {
  const parts = [header(msgType), parent || {}, {}, content].map((p) => JSON.stringify(p));
  return [...ids, DELIMITER, sign(parts), ...parts];
}

/** Sends on one socket in order: a ZeroMQ socket takes one send at a time. */
function sender(socket) {
  let chain = Promise.resolve();
  let queued = 0;
  let dropping = false;
  return (frames) => {
    const size = frames.reduce((n, f) => n + Buffer.byteLength(f), 0);
    if (queued + size > MAX_QUEUED_BYTES) {
      dropping = true;
      return chain;
    }
    queued += size;
    chain = chain
      .then(() => socket.send(frames))
      .catch(() => {})
      .finally(() => {
        queued -= size;
        if (dropping && queued === 0) dropping = false;
      });
    return chain;
  };
}

const shell = new zmq.Router();
const control = new zmq.Router();
const stdin = new zmq.Router();
const iopub = new zmq.Publisher();
const heartbeat = new zmq.Reply();
const sendShell = sender(shell);
const sendControl = sender(control);
const sendIopub = sender(iopub);

function publish(msgType, parent, content) {
  return sendIopub(encode([Buffer.from(msgType)], msgType, parent, content));
}

function status(parent, state) {
  return publish('status', parent, { execution_state: state });
}

// --- Output: what the user's code writes goes to the execution it belongs to. ---

let current = null; // the header of the request whose output is being published
for (const name of ['stdout', 'stderr']) {
  const stream = process[name];
  stream.write = (chunk, encoding, callback) => {
    const text = typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString(typeof encoding === 'string' ? encoding : 'utf8');
    if (text.length > 0) publish('stream', current, { name, text });
    const done = typeof encoding === 'function' ? encoding : callback;
    if (typeof done === 'function') process.nextTick(done);
    return true;
  };
}

/** The MIME bundle of a value: its inspection, or what it offers itself. */
function bundle(value) {
  if (value && typeof value === 'object' && typeof value[Symbol.for('jupyter.mime')] === 'function') {
    const b = value[Symbol.for('jupyter.mime')]();
    if (b && typeof b === 'object') return b;
  }
  return { 'text/plain': util.inspect(value) };
}

globalThis[DISPLAY] = bundle;

/** `display(value)` shows a value now; `display({'text/html': …}, {raw: true})` a bundle. */
globalThis.display = function display(value, options) {
  const data = options && options.raw ? value : bundle(value);
  publish('display_data', current, { data, metadata: {}, transient: {} });
};

// Modules resolve from the working directory, as a script there would.
const cwdRequire = Module.createRequire(path.join(process.cwd(), 'kernel-cell.js'));
globalThis.require = cwdRequire;

globalThis[IMPORT] = async function importFromCwd(specifier) {
  if (Module.isBuiltin(specifier) || /^[a-z]+:/.test(specifier)) return import(specifier);
  try {
    return await import(url.pathToFileURL(cwdRequire.resolve(specifier)).href);
  } catch (e) {
    // A package whose exports offer only `import`: let Node resolve it itself.
    if (e && e.code === 'MODULE_NOT_FOUND') throw e;
    return import(specifier);
  }
};

// --- Turning a cell into what V8's REPL mode runs. ---

function stripTypes(code) {
  // Loaded on first use: JavaScript kernels never pay for it.
  const { transform } = require('sucrase');
  return transform(code, {
    transforms: ['typescript'],
    disableESTransforms: true,
    keepUnusedImports: true,
    preserveDynamicImport: true,
  }).code;
}

function importCall(source) {
  return `await globalThis[Symbol.for("sandbox-gateway.import")](${JSON.stringify(source)})`;
}

/** Static `import`s become awaited dynamic imports; `export` keywords go (a cell is no module). */
function rewriteModuleSyntax(code) {
  if (!/\b(import|export)\b/.test(code)) return code;
  let ast;
  try {
    ast = acorn.parse(code, {
      ecmaVersion: 'latest',
      sourceType: 'module',
      allowAwaitOutsideFunction: true,
      allowHashBang: true,
    });
  } catch {
    return code; // let V8 report the syntax error in its own words
  }
  const edits = [];
  for (const node of ast.body) {
    if (node.type === 'ImportDeclaration') {
      const source = node.source.value;
      const named = [];
      let namespace = null;
      for (const s of node.specifiers) {
        if (s.type === 'ImportNamespaceSpecifier') namespace = s.local.name;
        else if (s.type === 'ImportDefaultSpecifier') named.push(`default: ${s.local.name}`);
        else {
          const imported = s.imported.type === 'Literal' ? JSON.stringify(s.imported.value) : s.imported.name;
          named.push(imported === s.local.name ? imported : `${imported}: ${s.local.name}`);
        }
      }
      const call = importCall(source);
      let text;
      if (namespace && named.length) text = `const ${namespace} = ${call}; const {${named.join(', ')}} = ${namespace};`;
      else if (namespace) text = `const ${namespace} = ${call};`;
      else if (named.length) text = `const {${named.join(', ')}} = ${call};`;
      else text = `${call};`;
      edits.push([node.start, node.end, text]);
    } else if ((node.type === 'ExportNamedDeclaration' || node.type === 'ExportDefaultDeclaration') && node.declaration) {
      edits.push([node.start, node.declaration.start, '']);
    }
  }
  let out = code;
  for (const [start, end, text] of edits.reverse()) out = out.slice(0, start) + text + out.slice(end);
  return out;
}

function prepare(code) {
  return rewriteModuleSyntax(LANGUAGE === 'typescript' ? stripTypes(code) : code);
}

// --- Running a cell. ---

const inspectorSession = new inspector.Session();
inspectorSession.connect();
function post(method, params) {
  return new Promise((resolve) => inspectorSession.post(method, params, (err, r) => resolve(err ? { protocolError: err } : r)));
}

let pending = null; // resolves the cell being waited for
process.on('SIGINT', () => {
  // Idle as far as V8 is concerned: a cell waits on a promise. It is given up.
  if (pending) pending({ interrupted: true });
});

/** Runs `expression` in REPL mode; SIGINT ends the synchronous part (`breakOnSigint`). */
function evaluate(expression) {
  return new Promise((resolve) => {
    const settle = (r) => {
      if (pending === settle) {
        pending = null;
        resolve(r);
      }
    };
    pending = settle;
    globalThis[EVAL] = () =>
      inspectorSession.post(
        'Runtime.evaluate',
        { expression, replMode: true, awaitPromise: true, objectGroup: 'cell' },
        (err, r) => settle(err ? { protocolError: err } : r),
      );
    try {
      vm.runInThisContext('globalThis[Symbol.for("sandbox-gateway.eval")]()', { breakOnSigint: true });
    } catch {
      settle({ interrupted: true });
    }
  });
}

/** Calls `fn` on a remote object (or primitive) of this process, answering a JSON value. */
async function callOn(remote, fn) {
  const arg = remote.objectId
    ? { objectId: remote.objectId }
    : 'unserializableValue' in remote
      ? { unserializableValue: remote.unserializableValue }
      : { value: remote.value };
  const r = await post('Runtime.callFunctionOn', {
    functionDeclaration: `function (v) { return (${fn})(v); }`,
    arguments: [arg],
    executionContextId: contextId,
    returnByValue: true,
    objectGroup: 'cell',
  });
  return r.result && !r.exceptionDetails ? r.result.value : undefined;
}

let contextId = undefined;
inspectorSession.on('Runtime.executionContextCreated', (m) => {
  if (contextId === undefined) contextId = m.params.context.id;
});

async function errorOf(details) {
  const exception = details.exception;
  const described = exception
    ? await callOn(exception, 'e => (e instanceof Error ? { name: e.name, message: e.message, stack: String(e.stack || "") } : { name: "Error", message: String(e), stack: "" })')
    : undefined;
  const e = described || { name: 'Error', message: details.text || 'the cell failed', stack: '' };
  return { ename: e.name, evalue: e.message, traceback: [ownFramesRemoved(e.stack) || `${e.name}: ${e.message}`] };
}

/** A stack without the frames of this kernel's machinery (everything below the cell). */
function ownFramesRemoved(stack) {
  const lines = String(stack || '').split('\n');
  const ours = lines.findIndex((l) => l.includes('node:inspector') || l.includes(__filename));
  return (ours > 0 ? lines.slice(0, ours) : lines).join('\n');
}

let executionCount = 0;

async function execute(msg) {
  const { code = '', silent = false, store_history = true } = msg.content;
  if (!silent && store_history !== false) executionCount += 1;
  const count = executionCount;
  current = msg.header;
  if (!silent) publish('execute_input', msg.header, { code, execution_count: count });
  let reply;
  let result = null;
  try {
    const outcome = await evaluate(prepare(code));
    if (outcome.interrupted) {
      reply = { status: 'error', ename: 'Error', evalue: 'Script execution was interrupted', traceback: ['Error: Script execution was interrupted'] };
    } else if (outcome.protocolError) {
      reply = { status: 'error', ename: 'Error', evalue: String(outcome.protocolError.message || outcome.protocolError), traceback: [] };
    } else if (outcome.exceptionDetails) {
      reply = { status: 'error', ...(await errorOf(outcome.exceptionDetails)) };
    } else {
      reply = { status: 'ok' };
      const value = outcome.result;
      if (value && value.type !== 'undefined' && !silent) {
        result = await callOn(value, 'v => globalThis[Symbol.for("sandbox-gateway.display")](v)');
      }
    }
  } catch (e) {
    // The transform itself failed (a TypeScript syntax error sucrase refuses).
    reply = { status: 'error', ename: e && e.name ? e.name : 'SyntaxError', evalue: e && e.message ? e.message : String(e), traceback: [] };
  }
  post('Runtime.releaseObjectGroup', { objectGroup: 'cell' });
  if (result) publish('execute_result', msg.header, { execution_count: count, data: result, metadata: {} });
  if (reply.status === 'error' && !silent) {
    publish('error', msg.header, { ename: reply.ename, evalue: reply.evalue, traceback: reply.traceback });
  }
  return { ...reply, execution_count: count, user_expressions: {}, payload: [] };
}

function kernelInfo() {
  const ts = LANGUAGE === 'typescript';
  return {
    status: 'ok',
    protocol_version: PROTOCOL,
    implementation: 'sandbox-gateway-js',
    implementation_version: '1.0',
    language_info: {
      name: LANGUAGE,
      version: process.versions.node,
      mimetype: ts ? 'text/typescript' : 'text/javascript',
      file_extension: ts ? '.ts' : '.js',
    },
    banner: `Node.js ${process.version} (${LANGUAGE})`,
    help_links: [],
  };
}

// Shell requests run one at a time, in order.
let queue = Promise.resolve();

async function handle(msg, send, channel) {
  const type = msg.header.msg_type;
  const respond = (replyType, content) => send(encode(msg.ids, replyType, msg.header, content));
  switch (type) {
    case 'kernel_info_request':
      await status(msg.header, 'busy');
      await respond('kernel_info_reply', kernelInfo());
      await status(msg.header, 'idle');
      return;
    case 'execute_request': {
      await status(msg.header, 'busy');
      const reply = await execute(msg);
      await respond('execute_reply', reply);
      await status(msg.header, 'idle');
      return;
    }
    case 'comm_info_request':
      await respond('comm_info_reply', { status: 'ok', comms: {} });
      return;
    case 'is_complete_request':
      await respond('is_complete_reply', { status: 'unknown' });
      return;
    case 'complete_request':
      await respond('complete_reply', { status: 'ok', matches: [], cursor_start: msg.content.cursor_pos || 0, cursor_end: msg.content.cursor_pos || 0, metadata: {} });
      return;
    case 'inspect_request':
      await respond('inspect_reply', { status: 'ok', found: false, data: {}, metadata: {} });
      return;
    case 'interrupt_request':
      if (pending) pending({ interrupted: true });
      await respond('interrupt_reply', { status: 'ok' });
      return;
    case 'shutdown_request':
      await respond('shutdown_reply', { status: 'ok', restart: Boolean(msg.content.restart) });
      process.exit(0);
      return;
    default:
      if (channel === 'shell') {
        await respond(type.replace(/_request$/, '_reply'), { status: 'error', ename: 'NotImplemented', evalue: `${type} is not supported`, traceback: [] });
      }
  }
}

async function serve(socket, send, channel) {
  for await (const frames of socket) {
    const msg = decode(frames);
    if (!msg) continue;
    if (channel === 'shell') {
      // In turn, behind the executions sent before.
      queue = queue.then(() => handle(msg, send, channel)).catch(() => {});
    } else {
      handle(msg, send, channel).catch(() => {});
    }
  }
}

async function beat() {
  for await (const frames of heartbeat) await heartbeat.send(frames);
}

async function main() {
  await post('Runtime.enable', {});
  await Promise.all([
    shell.bind(endpoint(conn.shell_port)),
    control.bind(endpoint(conn.control_port)),
    stdin.bind(endpoint(conn.stdin_port)),
    iopub.bind(endpoint(conn.iopub_port)),
    heartbeat.bind(endpoint(conn.hb_port)),
  ]);
  serve(shell, sendShell, 'shell');
  serve(control, sendControl, 'control');
  beat();
}

main().catch((e) => {
  fs.writeSync(2, `kernel: ${e && e.stack ? e.stack : e}\n`);
  process.exit(1);
});
