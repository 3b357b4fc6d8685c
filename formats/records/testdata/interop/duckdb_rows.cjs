// Reads any kiln Parquet shard with DuckDB, an implementation that shares no
// code with kiln, and prints its rows as one JSON array (BIGINT as exact
// numbers, TIMESTAMP as ISO-8601 text, NULL as null).
//
//   KILN_NPM_DIR=<dir holding node_modules> node duckdb_rows.cjs <file.parquet>
//
// Used by TestIndependentReadersGradesRollouts (formats/records/grades_interop_test.go).
'use strict';
const path = require('node:path');
const { createRequire } = require('node:module');

const npmDir = process.env.KILN_NPM_DIR;
if (!npmDir) throw new Error('KILN_NPM_DIR is not set');
const requireDep = createRequire(path.join(path.resolve(npmDir), 'package.json'));
const { DuckDBInstance } = requireDep('@duckdb/node-api');

function plain(v) {
  if (typeof v === 'bigint') {
    const n = Number(v);
    if (!Number.isSafeInteger(n)) throw new Error(`integer ${v} does not fit a JSON number exactly`);
    return n;
  }
  if (v instanceof Date) return v.toISOString();
  if (Array.isArray(v)) return v.map(plain);
  if (v !== null && typeof v === 'object') {
    return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, plain(x)]));
  }
  return v;
}

async function main() {
  const file = process.argv[2];
  if (!file) throw new Error('usage: duckdb_rows.cjs <file.parquet>');
  const instance = await DuckDBInstance.create(':memory:');
  const conn = await instance.connect();
  const reader = await conn.runAndReadAll(`SELECT * FROM read_parquet('${file.replaceAll("'", "''")}')`);
  process.stdout.write(JSON.stringify(plain(reader.getRowObjectsJS())) + '\n');
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
