// harness.js — start a real corrald with its HTTP API on a free loopback port, for the tests of
// the official clients (openai.test.js, ollama.test.js). CORRALD names the daemon binary and
// CORRAL_SHARED_DIR the shared test data (both set by ctest; ../../../shared by default).
//
// Each daemon gets a private folder (ipc socket, swap, cache) and is stopped with SIGTERM at the
// end; it must then exit 0. A watchdog kills a daemon that is still running after WATCHDOG_MS, so a
// request the daemon never answers fails its test instead of hanging the suite.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const WATCHDOG_MS = 120000;

export function sharedPath(relative) {
  const base = process.env.CORRAL_SHARED_DIR || path.join(here, '..', '..', '..', 'shared');
  const p = path.resolve(base, relative);
  if (!fs.existsSync(p)) throw new Error(`missing shared test file ${p} (set CORRAL_SHARED_DIR)`);
  return p;
}

// A loopback port nobody listens on now.
async function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

// Start corrald serving `stories` (stories260K.gguf) with `extra` YAML appended to its config.
// Resolves to { base, url(path), log(), stop() } once GET /api/version answers.
export async function startCorrald({ extra = '', context = 2048 } = {}) {
  const corrald = process.env.CORRALD;
  if (!corrald) throw new Error('CORRALD is not set: run the tests through ctest / make test');
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'corral-http-'));
  const port = await freePort();
  const config = path.join(tmp, 'corral.yaml');
  fs.writeFileSync(
    config,
    `listen: ["ipc://${tmp}/corral.sock"]\n` +
      `memory: {swap_dir: "${tmp}/swap"}\n` +
      `cache: {dir: "${tmp}/cache"}\n` +
      `http:\n  listen: ["127.0.0.1:${port}"]\n` +
      `models:\n  - name: stories\n    path: ${sharedPath('models/stories260K.gguf')}\n` +
      `    context: ${context}\n` +
      extra,
  );
  const logPath = path.join(tmp, 'corrald.log');
  const logFd = fs.openSync(logPath, 'w');
  const child = spawn(corrald, ['-c', config], { stdio: ['ignore', logFd, logFd] });
  fs.closeSync(logFd);
  let exited = null;
  const exit = new Promise((resolve) => child.on('exit', (code, signal) => {
    exited = { code, signal };
    resolve(exited);
  }));
  const watchdog = setTimeout(() => child.kill('SIGKILL'), WATCHDOG_MS);
  const base = `http://127.0.0.1:${port}`;
  const log = () => fs.readFileSync(logPath, 'utf8');
  const deadline = Date.now() + 20000;
  for (;;) {
    if (exited) throw new Error(`corrald exited ${JSON.stringify(exited)}:\n${log()}`);
    try {
      const r = await fetch(`${base}/api/version`);
      if (r.ok) break;
    } catch {
      /* not listening yet */
    }
    if (Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error(`corrald did not start:\n${log()}`);
    }
    await new Promise((r) => setTimeout(r, 20));
  }
  return {
    base,
    port,
    url: (p) => `${base}${p}`,
    log,
    async stop() {
      clearTimeout(watchdog);
      if (!exited) child.kill('SIGTERM');
      const { code, signal } = await exit;
      fs.rmSync(tmp, { recursive: true, force: true });
      if (code !== 0) throw new Error(`corrald exited ${code} (${signal}):\n${log()}`);
    },
  };
}

// Poll `check` (sync or async) until it returns a truthy value, at most `ms` milliseconds.
export async function waitFor(check, ms = 20000, what = 'condition') {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await check();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}
