// Reads a kiln tasks shard (Parquet) with DuckDB, an implementation that
// shares no code with kiln, and prints what it saw as one JSON object.
//
//   KILN_NPM_DIR=<dir holding node_modules> node duckdb_tasks.cjs <file.parquet>
//
// Used by TestIndependentReaders (formats/records/interop_test.go); the npm
// directory is made by scripts/install-test-deps.sh.
'use strict';
const path = require('node:path');
const { createRequire } = require('node:module');

const npmDir = process.env.KILN_NPM_DIR;
if (!npmDir) throw new Error('KILN_NPM_DIR is not set');
// Resolve packages from the cached install, not from this script's location.
const requireDep = createRequire(path.join(path.resolve(npmDir), 'package.json'));
const { DuckDBInstance } = requireDep('@duckdb/node-api');

// BIGINT comes back as a JS BigInt; emit it as an exact JSON number.
function plain(v) {
  if (typeof v === 'bigint') {
    const n = Number(v);
    if (!Number.isSafeInteger(n)) throw new Error(`integer ${v} does not fit a JSON number exactly`);
    return n;
  }
  if (Array.isArray(v)) return v.map(plain);
  if (v !== null && typeof v === 'object') {
    return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, plain(x)]));
  }
  return v;
}

async function main() {
  const file = process.argv[2];
  if (!file) throw new Error('usage: duckdb_tasks.cjs <file.parquet>');
  const src = `read_parquet('${file.replaceAll("'", "''")}', file_row_number = true)`;
  const instance = await DuckDBInstance.create(':memory:');
  const conn = await instance.connect();
  const all = async (sql) => plain((await conn.runAndReadAll(sql)).getRowObjectsJS());

  const [agg] = await all(`SELECT count(*) AS n,
      list(task_index ORDER BY file_row_number) AS task_index,
      count(dataset) AS dataset_non_null
    FROM ${src}`);
  const columns = (await all(`DESCRIBE SELECT * EXCLUDE (file_row_number) FROM ${src}`))
    .map((c) => ({ name: c.column_name, type: c.column_type }));
  const rows = await all(`SELECT * EXCLUDE (file_row_number) FROM ${src} ORDER BY file_row_number`);
  // JSON columns are plain VARCHAR to DuckDB; check they are usable as JSON.
  const jsonProbe = await all(`SELECT json_extract_string(metadata, '$.lang') AS metadata_lang,
      json_array_length(prompt) AS prompt_messages
    FROM ${src} ORDER BY file_row_number`);

  const codecs = (await all(`SELECT DISTINCT compression FROM parquet_metadata('${file.replaceAll("'", "''")}') ORDER BY 1`))
    .map((r) => r.compression);

  conn.closeSync();
  instance.closeSync();
  process.stdout.write(JSON.stringify({
    count: agg.n,
    task_index: agg.task_index,
    dataset_non_null: agg.dataset_non_null,
    columns,
    rows,
    json_probe: jsonProbe,
    codecs,
  }) + '\n');
}

main().catch((err) => {
  console.error(err && err.stack ? err.stack : err);
  process.exit(1);
});
