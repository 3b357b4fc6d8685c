// Reads kiln trajectories shards (Arrow IPC file format) with the Apache
// Arrow JS library, an implementation that shares no code with kiln, and
// prints one JSON object per file, one per line.
//
//   KILN_NPM_DIR=<dir holding node_modules> node arrow_trajectories.cjs <file.arrow>...
//
// Used by TestIndependentReaders (formats/records/interop_test.go); the npm
// directory is made by scripts/install-test-deps.sh.
//
// apache-arrow JS ships no compression codecs: reading a zstd-compressed
// record batch fails with "Record batch is compressed but codec not found"
// unless a codec is registered in its compressionRegistry. Kiln writes zstd
// buffers by default, so register fzstd (pure JS, decompression only).
'use strict';
const fs = require('node:fs');
const path = require('node:path');
const { createRequire } = require('node:module');

const npmDir = process.env.KILN_NPM_DIR;
if (!npmDir) throw new Error('KILN_NPM_DIR is not set');
// Resolve packages from the cached install, not from this script's location.
const requireDep = createRequire(path.join(path.resolve(npmDir), 'package.json'));
const arrow = requireDep('apache-arrow');
const fzstd = requireDep('fzstd');

let zstdFrames = 0;
arrow.compressionRegistry.set(arrow.CompressionType.ZSTD, {
  // Decode only: this script never writes Arrow.
  decode(buf) {
    zstdFrames++;
    return fzstd.decompress(buf);
  },
});

// Int64 comes back as a JS BigInt, lists as Vectors over typed arrays.
function plain(v) {
  if (v === null || v === undefined) return null;
  if (typeof v === 'bigint') {
    const n = Number(v);
    if (!Number.isSafeInteger(n)) throw new Error(`integer ${v} does not fit a JSON number exactly`);
    return n;
  }
  if (v instanceof arrow.Vector) return Array.from(v.toArray(), plain);
  if (ArrayBuffer.isView(v)) return Array.from(v, plain);
  return v;
}

function readFile(file) {
  zstdFrames = 0;
  const table = arrow.tableFromIPC(fs.readFileSync(file));
  const names = table.schema.fields.map((f) => f.name);
  const rows = [];
  for (let i = 0; i < table.numRows; i++) {
    const row = {};
    for (const name of names) row[name] = plain(table.getChild(name).get(i));
    rows.push(row);
  }
  return {
    file: path.basename(file),
    numRows: table.numRows,
    batches: table.batches.length,
    zstdFrames,
    fields: table.schema.fields.map((f) => ({ name: f.name, type: String(f.type), nullable: f.nullable })),
    rows,
  };
}

const files = process.argv.slice(2);
if (files.length === 0) {
  console.error('usage: arrow_trajectories.cjs <file.arrow>...');
  process.exit(2);
}
for (const file of files) process.stdout.write(JSON.stringify(readFile(file)) + '\n');
