#!/usr/bin/env python3
"""Check a model `npulm export` wrote against its contract (the exported model's interface:
inputs, outputs, opsets, QDQ nodes, OUT.encodings.json), with the official ONNX checker first.

    check_onnx.py MODEL.onnx [MODEL.encodings.json]

Loads the model (external data resolved), runs onnx.checker.check_model with full_check (shape
inference, strict), then checks:
- opsets: ai.onnx 17; com.microsoft 1 only where a node uses it; no other domain;
- the interface: inputs input_ids int32 [1,C], position_ids int32 [1,C], attention_mask float
  [1,1,C,K], past_key_L / past_value_L float [1,K-C,kv_dim] for L = 0..n_layers-1; outputs
  logits float [1,C,V] and present_key_L / present_value_L float [1,C,kv_dim]; static shapes,
  nothing else (C, K, kv_dim, V and n_layers are read from the shapes);
- every QuantizeLinear / DequantizeLinear: a constant (initializer or Constant) positive finite
  scale, and zero point where given; a per-axis one on a weight (an initializer) has an explicit
  axis and a 1-D scale as long as that axis;
- with the encodings: version, activation_encodings and param_encodings (dicts); every key a
  tensor of the graph (an initializer or a node output); every entry a list of encodings with
  bitwidth, dtype, is_symmetric, scale, offset, min, max, where min = offset * scale and
  max = (offset + 2^bitwidth - 1) * scale to 1e-6 relative, a symmetric one's offset
  -2^(bitwidth-1); where the key is the tensor a QuantizeLinear reads or a DequantizeLinear
  writes, its entries are that node's scales and offsets (AIMET's: qmin - zero point), one per
  channel; a 4-bit weight's int8 values lie in [-8, 7] (LPBQ: multiples of its blocks' integer
  scales, per_block_int_scale);
- the digests the model's metadata gives: npulm.initializers_xxh3_64 of the weights read, and
  npulm.encodings_xxh3_64 of the encodings file.
Prints one summary line and exits 0, or one line naming the first problem and exits 1.
Needs python3-onnx (Debian's, 1.12) and python3-xxhash (.ci/install-deps installs both)."""

import json
import math
import os
import re
import struct
import sys

import numpy as np
import onnx
import xxhash
from onnx import numpy_helper

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
# the exported model's element types (TensorProto.DataType)
FLOAT, INT32 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT32
ENCODING_FIELDS = ("bitwidth", "dtype", "is_symmetric", "scale", "offset", "min", "max")


class Problem(Exception):
    """The first thing found wrong: its message is the one line printed."""


def one_line(text):
    return re.sub(r"\s+", " ", str(text)).strip()


def run_checker(path, model):
    """onnx.checker with full_check; a model past protobuf's 2 GB by its path (shape inference
    then writes its result to a scratch file, not over the model)."""
    try:
        onnx.checker.check_model(model, full_check=True)
    except ValueError as e:
        if "too large" not in str(e):
            raise
        import tempfile

        onnx.checker.check_model(path)
        with tempfile.TemporaryDirectory() as d:
            onnx.shape_inference.infer_shapes_path(
                path, os.path.join(d, "inferred.onnx"), check_type=True, strict_mode=True
            )


def check_opsets(model):
    imports = {}
    for o in model.opset_import:
        domain = "" if o.domain in ("", "ai.onnx") else o.domain
        if domain in imports:
            raise Problem(f"opset domain '{o.domain or 'ai.onnx'}' imported twice")
        imports[domain] = o.version
    if imports.get("") != 17:
        raise Problem(f"ai.onnx opset is {imports.get('')}, the contract says 17")
    used = {("" if n.domain in ("", "ai.onnx") else n.domain) for n in model.graph.node}
    for domain in used - {"", "com.microsoft"}:
        raise Problem(f"a node of domain '{domain}', which the contract does not allow")
    for domain in set(imports) - {""}:
        if domain != "com.microsoft":
            raise Problem(f"opset domain '{domain}' imported, which the contract does not allow")
        if domain not in used:
            raise Problem("com.microsoft imported but no node uses it")
        if imports[domain] != 1:
            raise Problem(f"com.microsoft opset {imports[domain]}, the contract says 1")
    if "com.microsoft" in used and "com.microsoft" not in imports:
        raise Problem("a node of domain com.microsoft without its opset import")


def static_shape(value_info):
    """(element type, dims) of a graph input or output; every dim a number."""
    t = value_info.type.tensor_type
    dims = []
    for d in t.shape.dim:
        if not d.HasField("dim_value"):
            raise Problem(f"'{value_info.name}' has a dynamic dim ({d.dim_param or '?'})")
        dims.append(d.dim_value)
    return t.elem_type, dims


def check_interface(model):
    """The contract's inputs and outputs; returns (C, K, n_layers, kv_dim, n_vocab)."""
    inits = {i.name for i in model.graph.initializer}
    ins = {v.name: static_shape(v) for v in model.graph.input if v.name not in inits}
    outs = {v.name: static_shape(v) for v in model.graph.output}

    def shape(table, name, kind):
        if name not in table:
            raise Problem(f"no {kind} '{name}'")
        return table[name]

    def expect(table, name, kind, elem, dims):
        got_elem, got = shape(table, name, kind)
        if got_elem != elem or got != dims:
            want_t = onnx.TensorProto.DataType.Name(elem).lower()
            got_t = onnx.TensorProto.DataType.Name(got_elem).lower()
            raise Problem(f"{kind} '{name}' is {got_t} {got}, the contract says {want_t} {dims}")

    elem, dims = shape(ins, "attention_mask", "input")
    if elem != FLOAT or len(dims) != 4 or dims[:2] != [1, 1]:
        raise Problem(f"input 'attention_mask' is {dims}, the contract says float [1, 1, C, K]")
    c, k = dims[2], dims[3]
    if c < 1 or k < c:
        raise Problem(f"attention_mask [1, 1, {c}, {k}]: needs 1 <= C <= K")
    p = k - c  # past slots: none when C = K (a chunk from an empty cache)
    expect(ins, "input_ids", "input", INT32, [1, c])
    expect(ins, "position_ids", "input", INT32, [1, c])
    n_layers = sum(1 for name in outs if name.startswith("present_key_"))
    if n_layers == 0:
        raise Problem("no output present_key_0")
    kv_dim = shape(outs, "present_key_0", "output")[1][-1]
    for layer in range(n_layers):
        for kv in ("key", "value"):
            if p > 0:
                expect(ins, f"past_{kv}_{layer}", "input", FLOAT, [1, p, kv_dim])
            expect(outs, f"present_{kv}_{layer}", "output", FLOAT, [1, c, kv_dim])
    elem, dims = shape(outs, "logits", "output")
    if elem != FLOAT or len(dims) != 3 or dims[:2] != [1, c]:
        raise Problem(f"output 'logits' is {dims}, the contract says float [1, {c}, n_vocab]")
    n_vocab = dims[2]
    want_in = {"input_ids", "position_ids", "attention_mask"}
    want_in |= {f"past_{kv}_{i}" for kv in ("key", "value") for i in range(n_layers) if p > 0}
    want_out = {"logits"}
    want_out |= {f"present_{kv}_{i}" for kv in ("key", "value") for i in range(n_layers)}
    for extra in sorted(set(ins) - want_in):
        raise Problem(f"input '{extra}', which the contract does not have")
    for extra in sorted(set(outs) - want_out):
        raise Problem(f"output '{extra}', which the contract does not have")
    return c, k, n_layers, kv_dim, n_vocab


def constants(model):
    """Every constant tensor by name: initializers and Constant nodes' outputs (numpy arrays)."""
    table = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            for a in n.attribute:
                if a.name == "value":
                    table[n.output[0]] = numpy_helper.to_array(a.t)
    return table


def check_qdq(model, consts):
    """Every QuantizeLinear / DequantizeLinear; returns (n_q, n_dq, n_pairs)."""
    inits = {i.name for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    n_q = n_dq = n_pairs = 0
    for node in model.graph.node:
        if node.op_type not in QDQ_OPS:
            continue
        what = f"{node.op_type} '{node.name or node.output[0]}'"
        if node.op_type == "QuantizeLinear":
            n_q += 1
        else:
            n_dq += 1
            src = producer.get(node.input[0])
            if src is not None and src.op_type == "QuantizeLinear":
                n_pairs += 1
        if len(node.input) < 2 or node.input[1] not in consts:
            raise Problem(f"{what}: its scale is not a constant (an initializer)")
        scale = consts[node.input[1]]
        if scale.ndim > 1:
            raise Problem(f"{what}: scale of shape {list(scale.shape)}, not a scalar or 1-D")
        if not np.all(np.isfinite(scale)) or not np.all(scale > 0):
            raise Problem(f"{what}: a scale that is not finite and positive")
        has_zp = len(node.input) > 2 and node.input[2] != ""
        if has_zp:
            if node.input[2] not in consts:
                raise Problem(f"{what}: its zero point is not a constant (an initializer)")
            if consts[node.input[2]].shape != scale.shape:
                raise Problem(f"{what}: zero point and scale differ in shape")
        axis_attr = [a for a in node.attribute if a.name == "axis"]
        if node.op_type == "DequantizeLinear" and node.input[0] in inits and scale.size > 1:
            weight = consts[node.input[0]]
            if not axis_attr:
                raise Problem(f"{what}: a per-axis scale on a weight without an axis attribute")
            axis = axis_attr[0].i
            if not -weight.ndim <= axis < weight.ndim:
                raise Problem(f"{what}: axis {axis} outside the weight's {weight.ndim} dims")
            if scale.ndim != 1 or scale.shape[0] != weight.shape[axis]:
                raise Problem(
                    f"{what}: {scale.size} scales for axis {axis} of a weight {list(weight.shape)}"
                )
    return n_q, n_dq, n_pairs


def close(a, b, ref):
    return abs(a - b) <= 1e-6 * max(abs(a), abs(b), ref)


def check_entry(key, i, e):
    where = f"encoding '{key}'[{i}]"
    if not isinstance(e, dict):
        raise Problem(f"{where} is not an object")
    for f in ENCODING_FIELDS:
        if f not in e:
            raise Problem(f"{where} has no '{f}'")
    bw, scale, offset = e["bitwidth"], e["scale"], e["offset"]
    if not isinstance(bw, int) or isinstance(bw, bool) or not 1 <= bw <= 32:
        raise Problem(f"{where}: bitwidth {bw!r}")
    if e["dtype"] not in ("int", "float"):
        raise Problem(f"{where}: dtype {e['dtype']!r}, not 'int' or 'float'")
    if e["is_symmetric"] not in ("True", "False"):
        raise Problem(f"{where}: is_symmetric {e['is_symmetric']!r}, not 'True' or 'False'")
    for f in ("scale", "offset", "min", "max"):
        v = e[f]
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            raise Problem(f"{where}: {f} {v!r} is not a finite number")
    if not scale > 0:
        raise Problem(f"{where}: scale {scale} is not positive")
    if offset != int(offset):
        raise Problem(f"{where}: offset {offset} is not whole")
    if e["is_symmetric"] == "True" and offset != -(2 ** (bw - 1)):
        raise Problem(f"{where}: symmetric, but offset {offset} != -2^(bitwidth-1)")
    want_min, want_max = offset * scale, (offset + 2**bw - 1) * scale
    if not close(e["min"], want_min, scale):
        raise Problem(f"{where}: min {e['min']} != offset * scale = {want_min}")
    if not close(e["max"], want_max, scale):
        raise Problem(f"{where}: max {e['max']} != (offset + 2^bitwidth - 1) * scale = {want_max}")


def check_against_node(key, entries, node, consts):
    """The entries of 'key' against the QuantizeLinear that reads it or the DequantizeLinear that
    writes it: one per scale, each scale equal, each offset AIMET's for the zero point (the
    integer grid counted from its lowest value: qmin - zero point, qmin = -2^(bitwidth-1) for a
    signed zero point, 0 for an unsigned one or none)."""
    scale = consts[node.input[1]].reshape(-1)
    has_zp = len(node.input) > 2 and node.input[2] != ""
    zp = consts[node.input[2]].reshape(-1) if has_zp else np.zeros(scale.shape, np.uint8)
    signed = np.issubdtype(zp.dtype, np.signedinteger)
    weight = consts.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
    if weight is not None and weight.ndim == 2 and "per_block_int_scale" in entries[0]:
        check_lpbq(key, entries, weight)
    if len(entries) != scale.size:
        raise Problem(
            f"encoding '{key}' has {len(entries)} entries, its {node.op_type} {scale.size} scales"
        )
    for i, e in enumerate(entries):
        if not close(e["scale"], float(scale[i]), 0):
            raise Problem(
                f"encoding '{key}'[{i}]: scale {e['scale']}, its {node.op_type}'s {scale[i]}"
            )
        qmin = -(2 ** (e["bitwidth"] - 1)) if signed else 0
        if e["offset"] != qmin - int(zp[i]):
            raise Problem(
                f"encoding '{key}'[{i}]: offset {e['offset']}, but its {node.op_type}'s zero point "
                f"{zp[i]} ({zp.dtype}) at {e['bitwidth']} bits makes it {qmin - int(zp[i])}"
            )


def check_lpbq(key, entries, weight):
    """LPBQ (4-bit weights in blocks along k, each block's scale an integer 0..15 times its
    channel's): each channel's entry carries block_size and per_block_int_scale, over an int8
    weight that holds each 4-bit value times its block's integer scale (a block of scale 0 holds
    zeros) under the per-channel DequantizeLinear."""
    n, k = weight.shape
    for c, e in enumerate(entries):
        size, qs = e.get("block_size"), e.get("per_block_int_scale")
        blocks = -(-k // size) if isinstance(size, int) and size > 0 else -1
        if e["bitwidth"] != 4 or not isinstance(qs, list) or len(qs) != blocks:
            raise Problem(
                f"encoding '{key}'[{c}]: LPBQ needs bitwidth 4, block_size and {blocks} "
                f"per_block_int_scale values"
            )
        for b, q in enumerate(qs):
            vals = weight[c, b * size : (b + 1) * size].astype(np.int32)
            if not isinstance(q, int) or not 0 <= q <= 15:
                raise Problem(f"encoding '{key}'[{c}]: block {b}'s integer scale {q!r}")
            if (q == 0 and np.any(vals)) or (q > 0 and (np.any(vals % q) or np.any(np.abs(vals // q) > 8))):
                raise Problem(
                    f"param '{key}': channel {c} block {b} holds values that are not 4-bit "
                    f"multiples of its block scale {q}"
                )


def check_encodings(model, consts, path):
    try:
        with open(path, encoding="utf-8") as f:
            enc = json.load(f)
    except (OSError, ValueError) as e:
        raise Problem(f"{path}: {e}")
    if not isinstance(enc, dict):
        raise Problem(f"{path}: not a JSON object")
    if not isinstance(enc.get("version"), str):
        raise Problem(f"{path}: no version string")
    names = {i.name for i in model.graph.initializer}
    names |= {o for n in model.graph.node for o in n.output}
    reader = {}
    for n in model.graph.node:
        if n.op_type == "QuantizeLinear":
            reader.setdefault(n.input[0], n)
    writer = {n.output[0]: n for n in model.graph.node if n.op_type == "DequantizeLinear"}
    counts = []
    for section in ("activation_encodings", "param_encodings"):
        table = enc.get(section)
        if not isinstance(table, dict):
            raise Problem(f"{path}: no {section} object")
        for key, entries in table.items():
            if key not in names:
                raise Problem(f"{section}: '{key}' is no tensor of the graph")
            if not isinstance(entries, list) or not entries:
                raise Problem(f"{section}: '{key}' is not a non-empty list of encodings")
            for i, e in enumerate(entries):
                check_entry(key, i, e)
            node = reader.get(key) or writer.get(key)
            if node is not None:
                check_against_node(key, entries, node, consts)
            lpbq = "per_block_int_scale" in entries[0]
            if section == "param_encodings" and key in writer and entries[0]["bitwidth"] == 4 and not lpbq:
                q = consts.get(writer[key].input[0])
                if q is not None and (q.min() < -8 or q.max() > 7):
                    raise Problem(
                        f"param '{key}': 4-bit, but its weight holds [{q.min()}, {q.max()}]"
                    )
        counts.append(len(table))
    return counts


def check_digests(model, enc_path):
    """The model's metadata names its weights and its encodings by XXH3-64
    (npulm.initializers_xxh3_64: over each initializer's own digest, little-endian, in order;
    npulm.encodings_xxh3_64: of the encodings file's bytes), and they must be what is read."""
    meta = {p.key: p.value for p in model.metadata_props}
    digest = xxhash.xxh3_64()
    for t in model.graph.initializer:
        digest.update(struct.pack("<Q", xxhash.xxh3_64(t.raw_data).intdigest()))
    if meta.get("npulm.initializers_xxh3_64") != digest.hexdigest():
        raise Problem(
            f"npulm.initializers_xxh3_64 {meta.get('npulm.initializers_xxh3_64')!r}, "
            f"the weights read give {digest.hexdigest()}"
        )
    if enc_path is not None:
        with open(enc_path, "rb") as f:
            enc = xxhash.xxh3_64(f.read()).hexdigest()
        if meta.get("npulm.encodings_xxh3_64") != enc:
            raise Problem(
                f"npulm.encodings_xxh3_64 {meta.get('npulm.encodings_xxh3_64')!r}, "
                f"{os.path.basename(enc_path)} gives {enc}"
            )


def main(argv):
    if len(argv) not in (2, 3):
        print("usage: check_onnx.py MODEL.onnx [MODEL.encodings.json]", file=sys.stderr)
        return 1
    path = argv[1]
    try:
        try:
            model = onnx.load(path)
        except Exception as e:
            raise Problem(f"cannot load: {e}")
        try:
            run_checker(path, model)
        except Exception as e:
            raise Problem(f"onnx.checker: {e}")
        check_opsets(model)
        c, k, n_layers, kv_dim, n_vocab = check_interface(model)
        consts = constants(model)
        n_q, n_dq, n_pairs = check_qdq(model, consts)
        summary = (
            f"check_onnx: {os.path.basename(path)}: C={c} K={k} layers={n_layers} kv_dim={kv_dim} "
            f"vocab={n_vocab}; {len(model.graph.node)} nodes, {len(model.graph.initializer)} "
            f"initializers, {n_q} QuantizeLinear, {n_dq} DequantizeLinear, {n_pairs} QDQ pairs"
        )
        check_digests(model, argv[2] if len(argv) == 3 else None)
        if len(argv) == 3:
            n_act, n_param = check_encodings(model, consts, argv[2])
            summary += f"; encodings: {n_act} activation, {n_param} param"
    except Problem as e:
        print(f"check_onnx: {path}: {one_line(e)}")
        return 1
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
