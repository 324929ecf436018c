// The official TypeScript MCP SDK's client (@modelcontextprotocol/client, the v2 SDK; see
// package.json) against `agentledger mcp`, driven by tests/e2e/test_mcp_oauth.py.
//
// Input: one JSON object in the environment variable AGENTLEDGER_TS_CLIENT (url, issuer,
// clientId, clientSecret, scope, note {tool, arguments, key}, refund {tool, arguments},
// deadlineMs). Output: one JSON object a line on stdout, each with an "event":
//   http           every HTTP exchange the SDK made (method, url, status): the 401, the
//                  RFC 9728 metadata, the authorization server's metadata, the token request
//   connected      the negotiated protocol version
//   tools          the listed tool names
//   called         one tool result per retry (structuredContent)
//   task           the CreateTaskResult, then each tasks/get answer
//   done           the end; anything else ends with {"event": "error"} and exit status 1.
// The test decides the approval in the console while this script polls the task.
import {
  CLIENT_CAPABILITIES_META_KEY,
  CLIENT_INFO_META_KEY,
  Client,
  ClientCredentialsProvider,
  PROTOCOL_VERSION_META_KEY,
  StreamableHTTPClientTransport,
} from '@modelcontextprotocol/client';

const TASKS = 'io.modelcontextprotocol/tasks';
const VERSION = '2026-07-28';
const CLIENT_INFO = { name: 'agentledger-ts-e2e', version: '1' };
const CAPABILITIES = { extensions: { [TASKS]: {} } };

const config = JSON.parse(process.env.AGENTLEDGER_TS_CLIENT ?? '');
const deadline = Date.now() + (config.deadlineMs ?? 120000);
const emit = (event, body) => process.stdout.write(JSON.stringify({ event, ...body }) + '\n');

// Every request the SDK makes, recorded: the test asserts the discovery happened.
const recording = async (input, init) => {
  const response = await fetch(input, init);
  emit('http', { method: init?.method ?? 'GET', url: String(input instanceof Request ? input.url : input),
                 status: response.status });
  return response;
};

// A Standard Schema that accepts an object: tasks/* are extension methods, whose result
// schema the caller names (the SDK's request() asks for one).
const anObject = {
  '~standard': {
    version: 1, vendor: 'agentledger-e2e',
    validate: (value) => (typeof value === 'object' && value !== null
      ? { value } : { issues: [{ message: 'not an object' }] }),
  },
};

async function main() {
  const provider = new ClientCredentialsProvider({
    clientId: config.clientId, clientSecret: config.clientSecret, scope: config.scope,
    expectedIssuer: config.issuer,
  });
  const url = new URL(config.url);
  const transport = new StreamableHTTPClientTransport(url, { authProvider: provider, fetch: recording });
  const client = new Client(CLIENT_INFO, {
    capabilities: CAPABILITIES, versionNegotiation: { mode: { pin: VERSION } },
  });
  await client.connect(transport);
  emit('connected', { protocolVersion: client.getNegotiatedProtocolVersion?.() ?? null,
                      era: client.getProtocolEra() });

  const { tools } = await client.listTools();
  emit('tools', { names: tools.map((t) => t.name) });

  // One tool call, retried 5 times with the same idempotency key.
  for (let i = 0; i < 5; i++) {
    const result = await client.callTool({
      name: config.note.tool, arguments: config.note.arguments,
      _meta: { 'dev.agentledger/idempotency_key': config.note.key },
    });
    emit('called', { attempt: i + 1, isError: result.isError ?? false,
                     structuredContent: result.structuredContent ?? null });
  }

  // A call that needs a person, as a Task. The SDK 2.4.0 decodes only `complete` and
  // `input_required` results of tools/call (a CreateTaskResult, `resultType: "task"`, is an
  // UnsupportedResultType error there), so this one request goes through the SDK's
  // transport on its own: the same OAuth provider, the SDK's headers (Mcp-Method, Mcp-Name,
  // MCP-Protocol-Version), the per-request envelope written here. tasks/get then goes
  // through the client's request() with a result schema (an extension method).
  const created = await rawRequest(url, provider, 'tools/call', {
    name: config.refund.tool, arguments: config.refund.arguments,
    _meta: {
      [PROTOCOL_VERSION_META_KEY]: VERSION, [CLIENT_INFO_META_KEY]: CLIENT_INFO,
      [CLIENT_CAPABILITIES_META_KEY]: CAPABILITIES,
    },
  });
  emit('task', { task: created });
  if (created.resultType !== 'task') throw new Error(`no task: ${JSON.stringify(created)}`);

  let task = created;
  while (task.status !== 'completed' && task.status !== 'failed' && task.status !== 'cancelled') {
    if (Date.now() > deadline) throw new Error(`task ${created.taskId} still ${task.status}`);
    await new Promise((resolve) => setTimeout(resolve, task.pollIntervalMs ?? 1000));
    task = await client.request({ method: 'tasks/get', params: { taskId: created.taskId } }, anObject);
    emit('task', { task });
  }
  await client.close();
  emit('done', {});
}

async function rawRequest(url, provider, method, params) {
  const transport = new StreamableHTTPClientTransport(url, { authProvider: provider, fetch: recording });
  transport.setProtocolVersion(VERSION);
  const answer = new Promise((resolve, reject) => {
    transport.onmessage = (message) => {
      if (message.id !== 1) return;
      if (message.error) reject(new Error(`${method}: ${JSON.stringify(message.error)}`));
      else resolve(message.result);
    };
    transport.onerror = reject;
  });
  await transport.start();
  await transport.send({ jsonrpc: '2.0', id: 1, method, params });
  try {
    return await answer;
  } finally {
    await transport.close();
  }
}

main().then(() => process.exit(0), (error) => {
  emit('error', { message: String(error?.stack ?? error) });
  process.exit(1);
});
