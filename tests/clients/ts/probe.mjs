// The official MCP TypeScript SDK client, used as any user would: one session and calls back to
// back, then one JSON line with every call's outcome. The tests run it across a rolling deploy
// of mcp-epoch servers; nothing here knows about mcp-epoch.
//
// It is driven by its stdin, never by a clock, so a slow machine changes nothing it proves:
// `{"called": 1}` goes to stdout once the first call has ended, and once stdin closes the
// probe ends the call in flight, makes one more (begun after the close), and stops.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, steps = "10"] = process.argv.slice(2);
let closed = false;
process.stdin.on("end", () => { closed = true; });
process.stdin.resume();
const client = new Client({ name: "ts-probe", version: "1" });
const transport = new StreamableHTTPClientTransport(new URL(url));
await client.connect(transport);
const calls = [];
for (let n = 1; ; n++) {
  const last = closed; // this call began after stdin closed: it is the last one
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
  if (n === 1) console.log(JSON.stringify({ called: 1 }));
  if (last) break;
}
console.log(JSON.stringify({ session: transport.sessionId, calls }));
await client.close();
process.exit(0);
