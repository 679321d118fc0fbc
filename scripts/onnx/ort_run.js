#!/usr/bin/env node
// Runs an ONNX model in ONNX Runtime (onnxruntime-node, CPU execution provider) on inputs from .npy
// files and writes every output as an .npy file: how `trainer export --format onnx` models are
// checked against the trainer's own forward (tests/launch/test_onnx_export.py) and served.
//
//   node scripts/onnx/ort_run.js --ort DIR MODEL.onnx OUT_DIR NAME=FILE.npy [NAME=FILE.npy ...]
//
// DIR: where scripts/onnx/install_onnxruntime put onnxruntime-node (DIR/node_modules/...).
// .npy inputs: version 1/2 headers, little-endian float32 ('<f4'), int64 ('<i8'), int32 ('<i4') or
// uint8 ('|u1'), C order. Prints one JSON line: the runtime's version, the model's input and output
// names, each output's dims and file. Exit 2 naming the file or name on bad input (a missing model,
// an unreadable or unsupported .npy, an input the model does not have), 1 when the runtime fails.
'use strict';
const fs = require('fs');
const path = require('path');

const kTypes = {
  '<f4': { type: 'float32', array: Float32Array },
  '<i8': { type: 'int64', array: BigInt64Array },
  '<i4': { type: 'int32', array: Int32Array },
  '|u1': { type: 'uint8', array: Uint8Array },
};

function fail(message, code) {
  process.stderr.write(`ort_run: ${message}\n`);
  process.exit(code);
}

function readNpy(file) {
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
  const fortran = /'fortran_order':\s*(True|False)/.exec(header);
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header);
  if (!descr || !fortran || !shape) fail(`${file}: unreadable .npy header ${JSON.stringify(header)}`, 2);
  if (fortran[1] === 'True') fail(`${file}: Fortran-ordered arrays are not read`, 2);
  const kind = kTypes[descr[1]];
  if (!kind) fail(`${file}: dtype ${descr[1]} (expected one of ${Object.keys(kTypes).join(', ')})`, 2);
  const dims = shape[1].split(',').map((s) => s.trim()).filter((s) => s.length).map(Number);
  const count = dims.reduce((a, b) => a * b, 1);
  const offset = start + headerLen;
  if (buf.length - offset !== count * kind.array.BYTES_PER_ELEMENT)
    fail(`${file}: ${buf.length - offset} data bytes for shape (${dims}) of ${descr[1]}`, 2);
  // Copied into an aligned buffer: the data need not start at a multiple of the element size.
  const data = new kind.array(count);
  Buffer.from(data.buffer).set(buf.subarray(offset));
  return { type: kind.type, data, dims };
}

function writeNpy(file, tensor) {
  const descr = Object.keys(kTypes).find((k) => kTypes[k].type === tensor.type);
  if (!descr) fail(`output of type ${tensor.type} cannot be written as .npy`, 1);
  const shape = tensor.dims.length === 1 ? `(${tensor.dims[0]},)` : `(${tensor.dims.join(', ')})`;
  let header = `{'descr': '${descr}', 'fortran_order': False, 'shape': ${shape}, }`;
  header += ' '.repeat(64 - ((10 + header.length + 1) % 64)) + '\n';
  const pre = Buffer.alloc(10);
  pre.write('\x93NUMPY', 0, 'latin1');
  pre[6] = 1;
  pre[7] = 0;
  pre.writeUInt16LE(header.length, 8);
  const data = Buffer.from(tensor.data.buffer, tensor.data.byteOffset, tensor.data.byteLength);
  fs.writeFileSync(file, Buffer.concat([pre, Buffer.from(header, 'latin1'), data]));
}

async function main() {
  const args = process.argv.slice(2);
  let ortDir = process.env.ORT_DIR || '';
  if (args[0] === '--ort') {
    ortDir = args[1];
    args.splice(0, 2);
  }
  if (args.length < 3) fail('usage: ort_run.js --ort DIR MODEL.onnx OUT_DIR NAME=FILE.npy [...]', 2);
  const [model, outDir, ...pairs] = args;
  let ort;
  try {
    ort = require(path.resolve(ortDir, 'node_modules', 'onnxruntime-node'));
  } catch (e) {
    fail(`onnxruntime-node is not installed under ${ortDir || '.'} (scripts/onnx/install_onnxruntime): ${e.message}`, 2);
  }
  if (!fs.existsSync(model)) fail(`${model}: no such model file`, 2);
  if (!fs.existsSync(outDir) || !fs.statSync(outDir).isDirectory()) fail(`${outDir}: not a directory`, 2);
  const session = await ort.InferenceSession.create(model, { executionProviders: ['cpu'] });
  const feeds = {};
  for (const pair of pairs) {
    const eq = pair.indexOf('=');
    if (eq <= 0) fail(`'${pair}' is not NAME=FILE.npy`, 2);
    const name = pair.slice(0, eq);
    if (!session.inputNames.includes(name))
      fail(`the model has no input '${name}' (its inputs: ${session.inputNames.join(', ')})`, 2);
    const t = readNpy(pair.slice(eq + 1));
    feeds[name] = new ort.Tensor(t.type, t.data, t.dims);
  }
  const results = await session.run(feeds);
  const outputs = {};
  for (const name of session.outputNames) {
    const file = path.join(outDir, `${name}.npy`);
    writeNpy(file, results[name]);
    outputs[name] = { dims: results[name].dims, type: results[name].type, file };
  }
  process.stdout.write(JSON.stringify({
    onnxruntime: ort.env.versions.node,
    inputs: session.inputNames,
    outputs,
  }) + '\n');
}

main().catch((e) => fail(e && e.message ? e.message : String(e), 1));
