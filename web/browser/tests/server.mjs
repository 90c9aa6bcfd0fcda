// A static server for the browser tests: a folder at '/', files with HTTP Range support (also
// cut short, to stand for a truncated upload), raw bytes, and a log of every request path.
// Listens on 127.0.0.1 only.
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';

const TYPES = { '.html': 'text/html', '.js': 'text/javascript', '.css': 'text/css', '.wasm': 'application/wasm', '.json': 'application/json' };

function bytesOf(route) {
  if (route.bytes) return route.bytes;
  const all = fs.readFileSync(route.file);
  return route.truncate ? all.subarray(0, Math.floor(all.length * route.truncate)) : all;
}

export function serve(routes) {
  const cache = new Map();
  const requests = [];
  const server = http.createServer((req, res) => {
    const url = new URL(req.url, 'http://localhost');
    requests.push(url.pathname);
    let body;
    let type = 'application/octet-stream';
    const route = routes[url.pathname];
    if (route && typeof route === 'object') {
      if (!cache.has(url.pathname)) cache.set(url.pathname, bytesOf(route));
      body = cache.get(url.pathname);
    } else {
      const name = url.pathname === '/' ? 'index.html' : url.pathname.slice(1);
      const file = name === 'blank.html' ? null : path.join(routes['/'], path.normalize(name));
      if (name === 'blank.html') {
        body = Buffer.from('<!doctype html><title>infer browser tests</title>');
      } else if (file && file.startsWith(routes['/']) && fs.existsSync(file) && fs.statSync(file).isFile()) {
        body = fs.readFileSync(file);
      } else {
        res.writeHead(404).end('not found');
        return;
      }
      type = TYPES[path.extname(name || 'blank.html')] || type;
      if (name === 'blank.html') type = 'text/html';
    }
    const headers = { 'content-type': type, 'accept-ranges': 'bytes', 'cache-control': 'no-store' };
    const range = /^bytes=(\d+)-(\d+)?$/.exec(req.headers.range || '');
    if (range) {
      const a = Number(range[1]);
      const b = Math.min(range[2] === undefined ? body.length - 1 : Number(range[2]), body.length - 1);
      if (a > b) {
        res.writeHead(416, { 'content-range': `bytes */${body.length}` }).end();
        return;
      }
      res.writeHead(206, { ...headers, 'content-range': `bytes ${a}-${b}/${body.length}`, 'content-length': b - a + 1 });
      res.end(req.method === 'HEAD' ? undefined : body.subarray(a, b + 1));
      return;
    }
    res.writeHead(200, { ...headers, 'content-length': body.length });
    res.end(req.method === 'HEAD' ? undefined : body);
  });
  return new Promise((resolve) => {
    server.listen(0, '127.0.0.1', () => resolve({ port: server.address().port, requests, close: () => server.close() }));
  });
}
