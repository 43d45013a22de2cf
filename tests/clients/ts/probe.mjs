// The official MCP TypeScript SDK client, used as any user would: one session, calls back to
// back for a while, then one JSON line with every call's outcome. The tests run it across a
// rolling deploy of mcp-epoch servers; nothing here knows about mcp-epoch.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, seconds = "10", steps = "10"] = process.argv.slice(2);
const client = new Client({ name: "ts-probe", version: "1" });
const transport = new StreamableHTTPClientTransport(new URL(url));
await client.connect(transport);
const calls = [];
const end = Date.now() + Number(seconds) * 1000;
for (let n = 1; Date.now() < end; n++) {
  const began = Date.now();
  let progress = 0;
  try {
    const result = await client.callTool(
      { name: "work", arguments: { uid: "ts", call: `k${n}`, steps: Number(steps), interval: 0.1 } },
      undefined,
      { onprogress: () => { progress += 1; }, timeout: 60_000 },
    );
    calls.push({ n, ok: !result.isError, ms: Date.now() - began, progress, text: result.content?.[0]?.text });
  } catch (error) {
    calls.push({ n, ok: false, ms: Date.now() - began, progress, error: String(error) });
  }
}
console.log(JSON.stringify({ session: transport.sessionId, calls }));
await client.close();
