// An MCP server on the official TypeScript SDK (1.32), stateful, written as the SDK's README
// shows one: a session map, a transport per session, and (with --store example) the SDK's own
// example event store. Nothing here knows about mcp-epoch: it is what the sidecar is put in
// front of, in the demo's `sidecar` fleet and in the sidecar's tests.
//
//   node server.mjs --port 0 --name r1 [--store none|example] [--host 127.0.0.1]
//                   [--standalone on|off]
//
// prints one JSON line ({"port", "pid", "name"}) once it listens. Its tool `work` streams
// `steps` progress notifications, asks the client every `ask_every` steps (an elicitation),
// and with the example store closes its stream every `close_every` steps (SEP-1699 polling).
// Every message carries the demo's ground-truth token `uid|call|kind|n|name`. With
// --standalone off it offers no standalone GET stream (405, as the spec lets a server say),
// as the demo's Python replicas do: they send nothing unsolicited.
import http from "node:http";
import { randomUUID } from "node:crypto";
import { parseArgs } from "node:util";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { ElicitResultSchema, isInitializeRequest } from "@modelcontextprotocol/sdk/types.js";
import { InMemoryEventStore } from "@modelcontextprotocol/sdk/examples/shared/inMemoryEventStore.js";
import { z } from "zod";

const { values: opts } = parseArgs({
  options: {
    port: { type: "string", default: "0" },
    host: { type: "string", default: "127.0.0.1" },
    name: { type: "string", default: "ts" },
    store: { type: "string", default: "none" },
    standalone: { type: "string", default: "on" },
  },
});
const NAME = opts.name;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const token = (uid, call, kind, n) => [uid, call, kind, String(n), NAME].join("|");

function buildServer() {
  const server = new McpServer({ name: "mcp-epoch-demo", version: "1.0.0" });
  server.registerTool(
    "work",
    {
      description: "Stream progress, ask the client now and then, answer with a token.",
      inputSchema: {
        uid: z.string(),
        call: z.string(),
        steps: z.number().int(),
        interval: z.number(),
        ask_every: z.number().int().optional(),
        close_every: z.number().int().optional(),
      },
    },
    async ({ uid, call, steps, interval, ask_every = 0, close_every = 0 }, extra) => {
      const progressToken = extra._meta?.progressToken;
      let asks = 0;
      for (let step = 1; step <= steps; step++) {
        if (progressToken !== undefined) {
          await extra.sendNotification({
            method: "notifications/progress",
            params: { progressToken, progress: step, total: steps, message: token(uid, call, "step", step) },
          });
        }
        if (ask_every && step % ask_every === 0) {
          asks += 1;
          const asked = token(uid, call, "ask", asks);
          const answer = await extra.sendRequest(
            {
              method: "elicitation/create",
              params: {
                message: asked,
                requestedSchema: {
                  type: "object",
                  properties: { token: { type: "string" } },
                  required: ["token"],
                },
              },
            },
            ElicitResultSchema,
          );
          if (answer.action !== "accept" || answer.content?.token !== asked) {
            throw new Error(`answer to ${asked} was ${JSON.stringify(answer)}`);
          }
        }
        if (close_every && step % close_every === 0 && step < steps && extra.closeSSEStream) {
          extra.closeSSEStream();
        }
        if (interval > 0) await sleep(interval * 1000);
      }
      return { content: [{ type: "text", text: token(uid, call, "done", steps) }] };
    },
  );
  server.registerTool(
    "echo",
    { description: "Echo a text.", inputSchema: { text: z.string() } },
    async ({ text }) => ({ content: [{ type: "text", text }] }),
  );
  return server;
}

const transports = new Map();

function jsonError(res, status, message) {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32000, message }, id: null }));
}

async function readJson(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return JSON.parse(Buffer.concat(chunks).toString("utf8"));
}

const httpServer = http.createServer(async (req, res) => {
  res.setHeader("x-demo-replica", NAME);
  const path = new URL(req.url, "http://localhost").pathname;
  if (path === "/readyz") {
    res.writeHead(200, { "content-type": "application/json" });
    res.end('{"ready": true}');
    return;
  }
  if (path !== "/mcp") {
    res.writeHead(404).end();
    return;
  }
  try {
    if (req.method === "GET" && opts.standalone === "off" && !req.headers["last-event-id"]) {
      res.writeHead(405, { allow: "POST, DELETE" }).end();
      return;
    }
    const sessionId = req.headers["mcp-session-id"];
    if (sessionId) {
      const transport = transports.get(sessionId);
      if (!transport) {
        jsonError(res, 404, "Session not found");
        return;
      }
      await transport.handleRequest(req, res);
      return;
    }
    if (req.method !== "POST") {
      jsonError(res, 400, "Bad Request: no session");
      return;
    }
    const body = await readJson(req);
    if (!isInitializeRequest(body)) {
      jsonError(res, 400, "Bad Request: no session, and not an initialize request");
      return;
    }
    const transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      eventStore: opts.store === "example" ? new InMemoryEventStore() : undefined,
      onsessioninitialized: (id) => transports.set(id, transport),
    });
    transport.onclose = () => {
      if (transport.sessionId) transports.delete(transport.sessionId);
    };
    await buildServer().connect(transport);
    await transport.handleRequest(req, res, body);
  } catch (error) {
    if (!res.headersSent) jsonError(res, 500, String(error));
  }
});

httpServer.listen(Number(opts.port), opts.host, () => {
  const { port } = httpServer.address();
  console.log(JSON.stringify({ port, pid: process.pid, name: NAME }));
});
for (const signal of ["SIGTERM", "SIGINT"]) {
  process.on(signal, () => {
    httpServer.close();
    httpServer.closeAllConnections();
    process.exit(0);
  });
}
