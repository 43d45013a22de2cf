#!/usr/bin/env node
// Conformance target for mcp-epoch: an MCP server built on the official
// TypeScript SDK (@modelcontextprotocol/sdk, pinned in package.json) that
// implements every tool, resource, prompt and transport behaviour the server
// scenarios of the official MCP conformance suite (@modelcontextprotocol/
// conformance) ask for.  The suite is run against this server alone and again
// behind the mcp-epoch sidecar (mcp-epoch proxy), and the two runs are compared.
//
//   node everything.mjs [--host 127.0.0.1] [--port 0]
//
// Prints one JSON line {"port": N, "pid": P} on stdout once listening; MCP is
// served (stateful Streamable HTTP, resumable via an in-memory event store) at
// /mcp.  Everything else goes to stderr.  SIGTERM/SIGINT shut it down cleanly.
//
// It uses the SDK's low-level Server (not McpServer) on purpose: the suite
// checks tool input schemas verbatim (JSON Schema 2020-12 keywords), and plain
// JSON Schemas keep this file free of zod and of SDK internals.

import { randomUUID } from 'node:crypto';
import http from 'node:http';
import { parseArgs } from 'node:util';
import zlib from 'node:zlib';
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import {
  CallToolRequestSchema, CompleteRequestSchema, CreateMessageResultSchema, ElicitResultSchema,
  ErrorCode, GetPromptRequestSchema, ListPromptsRequestSchema, ListResourcesRequestSchema,
  ListResourceTemplatesRequestSchema, ListToolsRequestSchema, McpError, ReadResourceRequestSchema,
  SetLevelRequestSchema, SubscribeRequestSchema, UnsubscribeRequestSchema, isInitializeRequest,
} from '@modelcontextprotocol/sdk/types.js';

// ---------------------------------------------------------------- test media
// A 1x1 red PNG and a one-sample 16-bit mono WAV, built here rather than pasted.
function pngChunk(type, data) {
  const body = Buffer.concat([Buffer.from(type, 'latin1'), data]);
  const head = Buffer.alloc(4); head.writeUInt32BE(data.length);
  const crc = Buffer.alloc(4); crc.writeUInt32BE(zlib.crc32(body));
  return Buffer.concat([head, body, crc]);
}
const PNG = Buffer.concat([
  Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
  pngChunk('IHDR', Buffer.from([0, 0, 0, 1, 0, 0, 0, 1, 8, 2, 0, 0, 0])), // 1x1, 8-bit RGB
  pngChunk('IDAT', zlib.deflateSync(Buffer.from([0, 0xff, 0, 0]))), // filter 0, red pixel
  pngChunk('IEND', Buffer.alloc(0)),
]).toString('base64');

const WAV = (() => {
  const b = Buffer.alloc(46);
  b.write('RIFF', 0); b.writeUInt32LE(38, 4); b.write('WAVEfmt ', 8);
  b.writeUInt32LE(16, 16); b.writeUInt16LE(1, 20); b.writeUInt16LE(1, 22); // PCM, mono
  b.writeUInt32LE(8000, 24); b.writeUInt32LE(16000, 28); // sample rate, byte rate
  b.writeUInt16LE(2, 32); b.writeUInt16LE(16, 34); // block align, bits per sample
  b.write('data', 36); b.writeUInt32LE(2, 40); // one silent sample follows
  return b.toString('base64');
})();

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const text = (t) => ({ type: 'text', text: t });
const NO_ARGS = { type: 'object', properties: {} };
const stringArg = (name, description) =>
  ({ type: 'object', properties: { [name]: { type: 'string', description } }, required: [name] });

// -------------------------------------------------------------------- tools
// Each tool: description, JSON Schema inputSchema, run(args, ctx) -> CallToolResult.
// ctx = { extra, log(level, data) }, extra being the SDK's RequestHandlerExtra.
const TOOLS = {
  test_simple_text: {
    description: 'Returns a single text block',
    run: () => ({ content: [text('This is a simple text response for testing.')] }),
  },
  test_image_content: {
    description: 'Returns a PNG image block',
    run: () => ({ content: [{ type: 'image', data: PNG, mimeType: 'image/png' }] }),
  },
  test_audio_content: {
    description: 'Returns a WAV audio block',
    run: () => ({ content: [{ type: 'audio', data: WAV, mimeType: 'audio/wav' }] }),
  },
  test_embedded_resource: {
    description: 'Returns an embedded text resource',
    run: () => ({ content: [{ type: 'resource', resource:
      { uri: 'test://embedded-resource', mimeType: 'text/plain', text: 'This is an embedded resource content.' } }] }),
  },
  test_multiple_content_types: {
    description: 'Returns text, image and embedded resource blocks together',
    run: () => ({ content: [
      text('Multiple content types test:'),
      { type: 'image', data: PNG, mimeType: 'image/png' },
      { type: 'resource', resource: { uri: 'test://mixed-content-resource', mimeType: 'application/json',
        text: JSON.stringify({ test: 'data', value: 123 }) } },
    ] }),
  },
  test_tool_with_logging: {
    description: 'Emits three info log notifications while it runs',
    run: async (_args, { log }) => {
      await log('info', 'Tool execution started'); await sleep(50);
      await log('info', 'Tool processing data'); await sleep(50);
      await log('info', 'Tool execution completed');
      return { content: [text('Logging tool finished')] };
    },
  },
  test_tool_with_progress: {
    description: 'Reports progress 0, 50 and 100 of 100 when given a progress token',
    run: async (_args, { extra }) => {
      const progressToken = extra._meta?.progressToken;
      for (const progress of [0, 50, 100]) {
        if (progressToken !== undefined) {
          await extra.sendNotification({ method: 'notifications/progress',
            params: { progressToken, progress, total: 100, message: `${progress}%` } });
        }
        if (progress < 100) await sleep(50);
      }
      return { content: [text(`Progress tool finished (token ${progressToken ?? 'none'})`)] };
    },
  },
  test_error_handling: {
    description: 'Always fails with a tool error (isError: true)',
    run: () => ({ isError: true, content: [text('This tool intentionally returns an error for testing')] }),
  },
  test_reconnection: {
    description: 'Closes its SSE stream mid-call (SEP-1699); the result arrives after the client resumes',
    run: async (_args, { extra }) => {
      // The SDK only offers closeSSEStream to clients that can resume
      // (protocol >= 2025-11-25, event store configured); others keep the stream.
      extra.closeSSEStream?.();
      await sleep(100);
      return { content: [text(`Reconnection test completed (stream ${extra.closeSSEStream ? 'closed' : 'kept open'})`)] };
    },
  },
  test_sampling: {
    description: 'Asks the client to sample an LLM completion for the prompt',
    inputSchema: stringArg('prompt', 'Prompt to send to the LLM'),
    run: async ({ prompt }, { extra }) => {
      const res = await extra.sendRequest({ method: 'sampling/createMessage', params: {
        messages: [{ role: 'user', content: text(prompt) }], maxTokens: 100 } }, CreateMessageResultSchema);
      return { content: [text(`LLM response: ${res.content?.text ?? JSON.stringify(res.content)}`)] };
    },
  },
  test_elicitation: {
    description: 'Asks the client for user input (elicitation)',
    inputSchema: stringArg('message', 'Message shown to the user'),
    run: ({ message }, ctx) => elicit(ctx, message, {
      username: { type: 'string', description: "User's response" },
      email: { type: 'string', description: "User's email address" },
    }, ['username', 'email'], 'User response'),
  },
  test_elicitation_sep1034_defaults: {
    description: 'Elicitation whose schema carries defaults for every primitive type (SEP-1034)',
    run: (_args, ctx) => elicit(ctx, 'Confirm or edit the prefilled values', {
      name: { type: 'string', description: 'Name', default: 'John Doe' },
      age: { type: 'integer', description: 'Age', default: 30 },
      score: { type: 'number', description: 'Score', default: 95.5 },
      status: { type: 'string', description: 'Status', enum: ['active', 'inactive', 'pending'], default: 'active' },
      verified: { type: 'boolean', description: 'Verified', default: true },
    }),
  },
  test_elicitation_sep1330_enums: {
    description: 'Elicitation using all five enum schema shapes (SEP-1330)',
    run: (_args, ctx) => {
      const titled = (word) => [1, 2, 3].map((i) =>
        ({ const: `value${i}`, title: `${['First', 'Second', 'Third'][i - 1]} ${word}` }));
      return elicit(ctx, 'Pick from each list', {
        untitledSingle: { type: 'string', enum: ['option1', 'option2', 'option3'] },
        titledSingle: { type: 'string', oneOf: titled('Option') },
        legacyEnum: { type: 'string', enum: ['opt1', 'opt2', 'opt3'],
          enumNames: ['Option One', 'Option Two', 'Option Three'] },
        untitledMulti: { type: 'array', items: { type: 'string', enum: ['option1', 'option2', 'option3'] } },
        titledMulti: { type: 'array', items: { anyOf: titled('Choice') } },
      });
    },
  },
  json_schema_2020_12_tool: {
    description: 'Tool with JSON Schema 2020-12 features',
    inputSchema: {
      $schema: 'https://json-schema.org/draft/2020-12/schema',
      type: 'object',
      $defs: { address: { type: 'object', properties: { street: { type: 'string' }, city: { type: 'string' } } } },
      properties: { name: { type: 'string' }, address: { $ref: '#/$defs/address' } },
      additionalProperties: false,
    },
    run: (args) => ({ content: [text(`Called with ${JSON.stringify(args)}`)] }),
  },
};

async function elicit({ extra }, message, properties, required = [], label = 'Elicitation completed') {
  const res = await extra.sendRequest({ method: 'elicitation/create',
    params: { message, requestedSchema: { type: 'object', properties, required } } }, ElicitResultSchema);
  return { content: [text(`${label}: action=${res.action}, content=${JSON.stringify(res.content ?? {})}`)] };
}

// ---------------------------------------------------------------- resources
const RESOURCES = {
  'test://static-text': { name: 'static-text', description: 'Static text resource', mimeType: 'text/plain',
    text: 'This is the content of the static text resource.' },
  'test://static-binary': { name: 'static-binary', description: 'Static binary resource (PNG)', mimeType: 'image/png',
    blob: PNG },
  'test://watched-resource': { name: 'watched-resource', description: 'Resource clients may subscribe to',
    mimeType: 'text/plain', text: 'Watched resource content' },
};
const TEMPLATE = /^test:\/\/template\/([^/]+)\/data$/;

function readResource(uri) {
  const r = RESOURCES[uri];
  if (r) return { uri, mimeType: r.mimeType, ...(r.blob ? { blob: r.blob } : { text: r.text }) };
  const m = TEMPLATE.exec(uri);
  if (m) {
    const id = decodeURIComponent(m[1]);
    return { uri, mimeType: 'application/json', text: JSON.stringify({ id, templateTest: true, data: `Data for ID: ${id}` }) };
  }
  throw new McpError(-32002, `Resource not found: ${uri}`, { uri });
}

// ------------------------------------------------------------------ prompts
const PROMPTS = {
  test_simple_prompt: {
    description: 'Prompt without arguments',
    get: () => [{ role: 'user', content: text('This is a simple prompt for testing.') }],
  },
  test_prompt_with_arguments: {
    description: 'Prompt with two required arguments',
    arguments: [{ name: 'arg1', description: 'First argument', required: true },
      { name: 'arg2', description: 'Second argument', required: true }],
    get: (a) => [{ role: 'user', content: text(`Prompt with arguments: arg1='${a.arg1}', arg2='${a.arg2}'`) }],
  },
  test_prompt_with_embedded_resource: {
    description: 'Prompt that embeds the given resource',
    arguments: [{ name: 'resourceUri', description: 'URI of the resource to embed', required: true }],
    get: (a) => [
      { role: 'user', content: { type: 'resource',
        resource: { uri: a.resourceUri, mimeType: 'text/plain', text: 'Embedded resource content for testing.' } } },
      { role: 'user', content: text('Please process the embedded resource above.') },
    ],
  },
  test_prompt_with_image: {
    description: 'Prompt that contains an image',
    get: () => [
      { role: 'user', content: { type: 'image', data: PNG, mimeType: 'image/png' } },
      { role: 'user', content: text('Please analyze the image above.') },
    ],
  },
};
const COMPLETIONS = ['paris', 'park', 'party', 'test', 'testing'];

// ------------------------------------------------------- one server per session
const LEVELS = ['debug', 'info', 'notice', 'warning', 'error', 'critical', 'alert', 'emergency'];

function createServer() {
  const server = new Server({ name: 'mcp-epoch-conformance-everything', version: '1.0.0' }, {
    capabilities: { tools: {}, resources: { subscribe: true }, prompts: {}, logging: {}, completions: {} },
  });
  let minLevel = 'debug';
  const subscriptions = new Set();

  server.setRequestHandler(SetLevelRequestSchema, ({ params }) => { minLevel = params.level; return {}; });

  server.setRequestHandler(ListToolsRequestSchema, () => ({
    tools: Object.entries(TOOLS).map(([name, t]) =>
      ({ name, description: t.description, inputSchema: t.inputSchema ?? NO_ARGS })),
  }));
  server.setRequestHandler(CallToolRequestSchema, async ({ params }, extra) => {
    const tool = TOOLS[params.name];
    if (!tool) throw new McpError(ErrorCode.InvalidParams, `Unknown tool: ${params.name}`);
    const args = params.arguments ?? {};
    const missing = (tool.inputSchema?.required ?? []).filter((k) => typeof args[k] !== 'string');
    if (missing.length) throw new McpError(ErrorCode.InvalidParams, `Missing string argument(s): ${missing}`);
    const log = (level, data) => LEVELS.indexOf(level) < LEVELS.indexOf(minLevel) ? Promise.resolve()
      : extra.sendNotification({ method: 'notifications/message', params: { level, logger: 'everything', data } });
    return tool.run(args, { extra, log });
  });

  server.setRequestHandler(ListResourcesRequestSchema, () => ({
    resources: Object.entries(RESOURCES).map(([uri, { name, description, mimeType }]) =>
      ({ uri, name, description, mimeType })),
  }));
  server.setRequestHandler(ListResourceTemplatesRequestSchema, () => ({
    resourceTemplates: [{ uriTemplate: 'test://template/{id}/data', name: 'template',
      description: 'Template resource; {id} is echoed in the content', mimeType: 'application/json' }],
  }));
  server.setRequestHandler(ReadResourceRequestSchema, ({ params }) => ({ contents: [readResource(params.uri)] }));
  server.setRequestHandler(SubscribeRequestSchema, ({ params }) => { subscriptions.add(params.uri); return {}; });
  server.setRequestHandler(UnsubscribeRequestSchema, ({ params }) => { subscriptions.delete(params.uri); return {}; });

  server.setRequestHandler(ListPromptsRequestSchema, () => ({
    prompts: Object.entries(PROMPTS).map(([name, p]) =>
      ({ name, description: p.description, ...(p.arguments && { arguments: p.arguments }) })),
  }));
  server.setRequestHandler(GetPromptRequestSchema, ({ params }) => {
    const prompt = PROMPTS[params.name];
    if (!prompt) throw new McpError(ErrorCode.InvalidParams, `Unknown prompt: ${params.name}`);
    const missing = (prompt.arguments ?? []).filter((a) => a.required && params.arguments?.[a.name] === undefined);
    if (missing.length) throw new McpError(ErrorCode.InvalidParams, `Missing argument(s): ${missing.map((a) => a.name)}`);
    return { description: prompt.description, messages: prompt.get(params.arguments ?? {}) };
  });

  server.setRequestHandler(CompleteRequestSchema, ({ params }) => {
    const values = COMPLETIONS.filter((v) => v.startsWith(params.argument.value ?? ''));
    return { completion: { values, total: values.length, hasMore: false } };
  });
  return server;
}

// --------------------------------------------------- in-memory event store
// One per session.  Event ids are "<streamId>#<seq>"; insertion order of the Map
// is the replay order.  Priming events (empty messages) are stored but not replayed.
function createEventStore() {
  const events = new Map();
  let seq = 0;
  return {
    async storeEvent(streamId, message) {
      const id = `${streamId}#${++seq}`;
      events.set(id, { streamId, message });
      return id;
    },
    async getStreamIdForEventId(id) { return events.get(id)?.streamId; },
    async replayEventsAfter(lastId, { send }) {
      const streamId = events.get(lastId)?.streamId;
      if (streamId === undefined) throw new Error(`Unknown event id ${lastId}`);
      let after = false;
      for (const [id, ev] of events) {
        if (after && ev.streamId === streamId && Object.keys(ev.message).length > 0) await send(id, ev.message);
        if (id === lastId) after = true;
      }
      return streamId;
    },
  };
}

// ------------------------------------------------------------------- HTTP
const { values: opts } = parseArgs({ options: {
  host: { type: 'string', default: '127.0.0.1' },
  port: { type: 'string', default: '0' },
} });

// DNS-rebinding protection: Host (and Origin, when sent) must name this machine.
const LOCAL_NAMES = new Set(['localhost', '127.0.0.1', '[::1]']);
if (!['0.0.0.0', '::', ''].includes(opts.host)) {
  LOCAL_NAMES.add(new URL(`http://${opts.host.includes(':') ? `[${opts.host}]` : opts.host}`).hostname);
}
function hostnameOf(value, withScheme) {
  try { return new URL(withScheme ? value : `http://${value}`).hostname.toLowerCase(); } catch { return null; }
}
function rebindingError(req) {
  if (!LOCAL_NAMES.has(hostnameOf(req.headers.host ?? '', false))) return `Invalid Host header: ${req.headers.host}`;
  const origin = req.headers.origin;
  if (origin !== undefined && origin !== 'null' && !LOCAL_NAMES.has(hostnameOf(origin, true))) {
    return `Invalid Origin header: ${origin}`;
  }
  return null;
}

function sendJsonError(res, status, code, message) {
  if (res.headersSent) { res.end(); return; }
  res.writeHead(status, { 'Content-Type': 'application/json' })
    .end(JSON.stringify({ jsonrpc: '2.0', error: { code, message }, id: null }));
}

async function readJson(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return JSON.parse(Buffer.concat(chunks).toString('utf8'));
}

const sessions = new Map(); // session id -> { server, transport }

async function handle(req, res) {
  if (new URL(req.url, 'http://x').pathname !== '/mcp') return sendJsonError(res, 404, -32000, 'Not found');
  const rejected = rebindingError(req);
  if (rejected) return sendJsonError(res, 403, -32000, rejected);

  const sessionId = req.headers['mcp-session-id'];
  let body;
  if (req.method === 'POST') {
    try { body = await readJson(req); } catch { return sendJsonError(res, 400, ErrorCode.ParseError, 'Parse error'); }
  }
  if (sessionId !== undefined) {
    const session = sessions.get(sessionId);
    if (!session) return sendJsonError(res, 404, -32001, 'Session not found');
    return session.transport.handleRequest(req, res, body);
  }
  if (req.method !== 'POST' || !isInitializeRequest(body)) {
    return sendJsonError(res, 400, -32000, 'Bad Request: missing session id (only initialize may omit it)');
  }
  const server = createServer();
  const transport = new StreamableHTTPServerTransport({
    sessionIdGenerator: randomUUID,
    eventStore: createEventStore(),
    retryInterval: 1000,
    onsessioninitialized: (id) => { sessions.set(id, { server, transport }); },
  });
  transport.onclose = () => { if (transport.sessionId) sessions.delete(transport.sessionId); };
  await server.connect(transport);
  await transport.handleRequest(req, res, body);
}

const httpServer = http.createServer((req, res) => {
  handle(req, res).catch((err) => {
    console.error('request failed:', err);
    sendJsonError(res, 500, ErrorCode.InternalError, 'Internal server error');
  });
});

httpServer.listen(Number(opts.port), opts.host, () => {
  process.stdout.write(`${JSON.stringify({ port: httpServer.address().port, pid: process.pid })}\n`);
});

async function shutdown(signal) {
  console.error(`${signal}: closing ${sessions.size} session(s)`);
  httpServer.close();
  await Promise.allSettled([...sessions.values()].map(({ server }) => server.close()));
  httpServer.closeAllConnections();
  process.exit(0);
}
process.on('SIGTERM', () => shutdown('SIGTERM'));
process.on('SIGINT', () => shutdown('SIGINT'));
