// An MCP client made with the official TypeScript SDK, started the way an
// agent framework starts one: StdioClientTransport with its default
// (minimal) environment. It lists the tools and reads a file, and prints
// what it got as JSON.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [amlfs, mountpoint, file] = process.argv.slice(2);
const transport = new StdioClientTransport({ command: amlfs, args: ["mcp", mountpoint] });
const client = new Client({ name: "amlfs-ts-test", version: "1.0.0" });
await client.connect(transport);
const { tools } = await client.listTools();
const read = await client.callTool({ name: "read_file", arguments: { path: file } });
console.log(JSON.stringify({
  tools: tools.map((t) => ({ name: t.name, readOnly: t.annotations?.readOnlyHint, destructive: t.annotations?.destructiveHint })),
  read: read.content[0].text,
  isError: read.isError ?? false,
}));
await client.close();
