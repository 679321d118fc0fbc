#!/usr/bin/env node
// Accuracy and latency of an image classifier exported by `trainer export --format onnx` (f32 or
// int8 QDQ) in ONNX Runtime (onnxruntime-node, CPU execution provider, all graph optimizations):
// how docs/performance.md's int8 table is measured (scripts/onnx/int8_table) and how the int8
// tests check a quantized model (tests/launch/test_onnx_int8.py).
//
//   node scripts/onnx/ort_bench.js --ort DIR MODEL.onnx --images IMAGES.npy --labels LABELS.npy
//        [--eval-batch 500] [--latency 1,256] [--runs 30] [--warmup 5] [--threads N]
//        [--optimized OUT.onnx]
//
// IMAGES: uint8 [N, H, W, C] ('|u1'), LABELS: int64 [N] ('<i8'). Prints one JSON line: the
// runtime's version, accuracy over the N images (argmax of the logits, in batches of --eval-batch),
// per --latency batch size the median / min / max wall time of --runs session.run calls after
// --warmup (ms; the first images of the set), and with --optimized the node types of the graph ORT
// runs (written there by its optimizer, session option optimizedModelFilePath): an int8 model must
// show integer kernels (QLinearConv, MatMulIntegerToFloat, ...), not DequantizeLinear + f32 ops.
// Exit 2 naming the problem on bad input, 1 when the runtime fails.
'use strict';
const fs = require('fs');
const path = require('path');

function fail(message, code) {
  process.stderr.write(`ort_bench: ${message}\n`);
  process.exit(code);
}

function readNpy(file, want) {
  let buf;
  try {
    buf = fs.readFileSync(file);
  } catch (e) {
    fail(`${file}: ${e.message}`, 2);
  }
  if (buf.length < 10 || buf.toString('latin1', 0, 6) !== '\x93NUMPY') fail(`${file}: not an .npy file`, 2);
  const major = buf[6];
  const headerLen = major === 1 ? buf.readUInt16LE(8) : buf.readUInt32LE(8);
  const start = major === 1 ? 10 : 12;
  const header = buf.toString('latin1', start, start + headerLen);
  const descr = /'descr':\s*'([^']+)'/.exec(header);
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header);
  if (!descr || !shape || /'fortran_order':\s*True/.test(header)) fail(`${file}: unreadable .npy header`, 2);
  if (descr[1] !== want.descr) fail(`${file}: dtype ${descr[1]}, expected ${want.descr}`, 2);
  const dims = shape[1].split(',').map((s) => s.trim()).filter((s) => s.length).map(Number);
  const count = dims.reduce((a, b) => a * b, 1);
  const offset = start + headerLen;
  if (buf.length - offset !== count * want.array.BYTES_PER_ELEMENT) fail(`${file}: truncated data`, 2);
  const data = new want.array(count);
  Buffer.from(data.buffer).set(buf.subarray(offset));
  return { data, dims };
}

function parseArgs(argv) {
  const o = { ort: process.env.ORT_DIR || '', evalBatch: 500, latency: [1, 256], runs: 30, warmup: 5, threads: 0 };
  const rest = [];
  for (let i = 0; i < argv.length; ++i) {
    const a = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) fail(`${a} needs a value`, 2);
      return argv[++i];
    };
    const positive = (v) => {
      const n = Number(v);
      if (!Number.isInteger(n) || n < 1) fail(`${a} ${v}: expected a positive integer`, 2);
      return n;
    };
    if (a === '--ort') o.ort = value();
    else if (a === '--images') o.images = value();
    else if (a === '--labels') o.labels = value();
    else if (a === '--eval-batch') o.evalBatch = positive(value());
    else if (a === '--latency') o.latency = value().split(',').filter((s) => s.length).map(positive);
    else if (a === '--runs') o.runs = positive(value());
    else if (a === '--warmup') o.warmup = Number(value());
    else if (a === '--threads') o.threads = positive(value());
    else if (a === '--optimized') o.optimized = value();
    else if (a.startsWith('--')) fail(`unknown option ${a}`, 2);
    else rest.push(a);
  }
  if (rest.length !== 1 || !o.images || !o.labels) fail('usage: ort_bench.js --ort DIR MODEL.onnx --images X.npy --labels Y.npy [...]', 2);
  o.model = rest[0];
  return o;
}

function slice(ort, images, from, n) {
  const per = images.dims.slice(1).reduce((a, b) => a * b, 1);
  const data = images.data.subarray(from * per, (from + n) * per);
  return new ort.Tensor('uint8', data, [n, ...images.dims.slice(1)]);
}

function argmaxRows(t) {
  const [n, k] = t.dims;
  const out = [];
  for (let r = 0; r < n; ++r) {
    let best = 0;
    for (let c = 1; c < k; ++c) if (t.data[r * k + c] > t.data[r * k + best]) best = c;
    out.push(best);
  }
  return out;
}

async function main() {
  const o = parseArgs(process.argv.slice(2));
  let ort;
  try {
    ort = require(path.resolve(o.ort, 'node_modules', 'onnxruntime-node'));
  } catch (e) {
    fail(`onnxruntime-node is not installed under ${o.ort || '.'} (scripts/onnx/install_onnxruntime): ${e.message}`, 2);
  }
  if (!fs.existsSync(o.model)) fail(`${o.model}: no such model file`, 2);
  const images = readNpy(o.images, { descr: '|u1', array: Uint8Array });
  const labels = readNpy(o.labels, { descr: '<i8', array: BigInt64Array });
  if (images.dims.length !== 4 || labels.dims.length !== 1 || labels.dims[0] !== images.dims[0])
    fail(`images ${images.dims} and labels ${labels.dims}: expected [N, H, W, C] and [N]`, 2);
  const options = { executionProviders: ['cpu'], graphOptimizationLevel: 'all' };
  if (o.threads) options.intraOpNumThreads = o.threads;
  if (o.optimized) options.optimizedModelFilePath = o.optimized;
  const session = await ort.InferenceSession.create(o.model, options);
  const input = session.inputNames[0], output = session.outputNames[0];
  const N = images.dims[0];
  let correct = 0;
  for (let from = 0; from < N; from += o.evalBatch) {
    const n = Math.min(o.evalBatch, N - from);
    const r = await session.run({ [input]: slice(ort, images, from, n) });
    argmaxRows(r[output]).forEach((p, i) => { if (BigInt(p) === labels.data[from + i]) ++correct; });
  }
  const latency = {};
  for (const b of o.latency) {
    if (b > N) fail(`--latency batch ${b} exceeds the ${N} images`, 2);
    const feed = { [input]: slice(ort, images, 0, b) };
    for (let i = 0; i < o.warmup; ++i) await session.run(feed);
    const ms = [];
    for (let i = 0; i < o.runs; ++i) {
      const t0 = process.hrtime.bigint();
      await session.run(feed);
      ms.push(Number(process.hrtime.bigint() - t0) / 1e6);
    }
    ms.sort((a, c) => a - c);
    const mid = ms.length >> 1;
    latency[b] = { median_ms: ms.length % 2 ? ms[mid] : (ms[mid - 1] + ms[mid]) / 2, min_ms: ms[0],
                   max_ms: ms[ms.length - 1], runs: ms.length };
  }
  const result = { onnxruntime: ort.env.versions.node, model: o.model, images: N, accuracy: correct / N, latency };
  if (o.optimized) result.optimized = o.optimized;
  process.stdout.write(JSON.stringify(result) + '\n');
}

main().catch((e) => fail(e && e.message ? e.message : String(e), 1));
