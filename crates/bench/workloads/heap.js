// Node.js heap workload for `farmem-bench compare --workload node-heap`.
//
// Usage: node --max-old-space-size=M --max-semi-space-size=16 heap.js HEAP_BYTES PASSES SEED
//
// Builds about HEAP_BYTES of live JS objects on V8's heap: records {id, v, w} (three small
// integers: a 48-byte object with in-object properties, plus its 8-byte slot in a chunk array;
// 56 bytes each on 64-bit node without pointer compression), held in arrays of 65536 records.
// Record i starts with v = f(i), w = g(i), both 30-bit hashes of i and the seed. Then PASSES
// passes in order over every record, each adding 1 to v (a read-modify-write: the pages are
// dirty again each pass) and summing v mod 2^32. Every record is checked on every pass against
// values computed from i alone (id = i, v = f(i) + pass, w = g(i)), and each pass sum against
// the sum of those values, so a lost, stale or misplaced page fails the run. Prints one JSON
// line with the phase times; a mismatch is an error message on stderr and exit status 3, bad
// arguments exit status 2.
'use strict';

const RECORD_BYTES = 56;
const CHUNK = 65536;

function usage(msg) {
  process.stderr.write(`heap.js: ${msg}\nusage: node heap.js HEAP_BYTES PASSES SEED\n`);
  process.exit(2);
}

const [heapArg, passesArg, seedArg] = process.argv.slice(2);
const heapBytes = Number(heapArg);
const passes = Number(passesArg === undefined ? 1 : passesArg);
const seed = Number(seedArg === undefined ? 42 : seedArg);
if (!Number.isSafeInteger(heapBytes) || heapBytes < 4096) usage('HEAP_BYTES must be an integer >= 4096');
if (!Number.isSafeInteger(passes) || passes < 1) usage('PASSES must be an integer >= 1');
if (!Number.isSafeInteger(seed) || seed < 0) usage('SEED must be a non-negative integer');

const n = Math.floor(heapBytes / RECORD_BYTES);
if (n >= 2 ** 31) usage('HEAP_BYTES is too large (at most 2^31 records)');
// The seed folded to 32 bits (exactly as Heap.java does: (int) seed ^ (int) (seed >>> 32)).
const seedMix = (Number(BigInt.asIntN(32, BigInt(seed))) ^ Number(BigInt.asIntN(32, BigInt(seed) >> 32n))) | 0;
const f = (i) => Math.imul(i ^ seedMix, 0x9e3779b1 | 0) >>> 2;
const g = (i) => Math.imul((i + seedMix) | 0, 0x85ebca6b | 0) >>> 2;

const t0 = process.hrtime.bigint();
const chunks = [];
for (let start = 0; start < n; start += CHUNK) {
  const end = Math.min(n, start + CHUNK);
  const chunk = [];
  for (let i = start; i < end; i++) chunk.push({ id: i, v: f(i), w: g(i) });
  chunks.push(chunk);
}
const t1 = process.hrtime.bigint();
const heapUsed = process.memoryUsage().heapUsed;

const sums = [];
let bad = 0;
let firstBad = null;
for (let p = 1; p <= passes; p++) {
  let sum = 0;
  let want = 0;
  let i = 0;
  for (const chunk of chunks) {
    for (let k = 0; k < chunk.length; k++, i++) {
      const r = chunk[k];
      const v = r.v + 1;
      r.v = v;
      sum = (sum + v) >>> 0;
      const wv = f(i) + p;
      want = (want + wv) >>> 0;
      if (r.id !== i || v !== wv || r.w !== g(i)) {
        bad++;
        if (firstBad === null) firstBad = `pass ${p}: record ${i} holds id ${r.id} v ${r.v} w ${r.w}, expected id ${i} v ${wv} w ${g(i)}`;
      }
    }
  }
  if (i !== n) {
    bad++;
    if (firstBad === null) firstBad = `pass ${p}: ${i} records found, ${n} built`;
  }
  if (sum !== want) {
    bad++;
    if (firstBad === null) firstBad = `pass ${p}: sum ${sum}, expected ${want}`;
  }
  sums.push(sum);
}
const t2 = process.hrtime.bigint();
const secs = (a, b) => Number(b - a) / 1e9;
const ok = bad === 0;
console.log(JSON.stringify({
  records: n, record_bytes: RECORD_BYTES, live_bytes: n * RECORD_BYTES, heap_used_bytes: heapUsed,
  passes, sums, generate_s: secs(t0, t1), passes_s: secs(t1, t2), elapsed_s: secs(t0, t2),
  checksum_ok: ok,
}));
if (!ok) {
  process.stderr.write(`heap.js: ${bad} mismatches; first: ${firstBad}\n`);
  process.exit(3);
}
