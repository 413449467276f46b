"""`python -m bert_jax.benchmark.profile`: a traced step reduced to where its time goes, from a GPU-like
trace written here (kernels on a stream, a derived line that must not count twice, kernels the HLO
names and kernels it does not) and from a real CPU trace of the benchmark's own step."""

import gzip
import json

import pytest

from bert_jax.benchmark import profile, step

HLO = """HloModule jit_run, entry_computation_layout={()->()}

%fused_computation.1 (param_0: bf16[8,4]) -> bf16[8,4] {
  %param_0 = bf16[8,4]{1,0} parameter(0)
  ROOT %select.1 = bf16[8,4]{1,0} select(%param_0, %param_0, %param_0), metadata={op_name="jit(run)/jvp(dropout)/select_n"}
}

%fused_computation.2 (param_0: bf16[8,4]) -> bf16[4,8] {
  %param_0 = bf16[8,4]{1,0} parameter(0)
  ROOT %transpose.2 = bf16[4,8]{0,1} transpose(%param_0), dimensions={1,0}
}

%gemm_fusion_dot.3_computation (p: bf16[8,4]) -> bf16[8,8] {
  %p = bf16[8,4]{1,0} parameter(0)
  ROOT %dot.3 = bf16[8,8]{1,0} dot(%p, %p), lhs_contracting_dims={1}, rhs_contracting_dims={1}
}

ENTRY %main () -> () {
  %loop_select_fusion = bf16[8,4]{1,0} fusion(%a), kind=kLoop, calls=%fused_computation.1, metadata={op_name="jit(run)/jvp(dropout)/select_n"}
  %custom-call.7 = (bf16[8,8]{1,0}, s8[4]{0}) custom-call(%a, %b), custom_call_target="__cublas$gemm", metadata={op_name="jit(run)/jvp(bert)/dot_general"}
  %gemm_fusion_dot.3 = bf16[8,8]{1,0} fusion(%a), kind=kCustom, calls=%gemm_fusion_dot.3_computation, metadata={op_name="jit(run)/transpose(jvp(attention))/dot_general"}, backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}
  %loop_transpose_fusion = bf16[4,8]{0,1} fusion(%a), kind=kLoop, calls=%fused_computation.2, metadata={op_name="jit(run)/jvp(bert)/transpose"}
  %loop_add_fusion.4 = f32[8]{0} fusion(%a), kind=kLoop, calls=%fused_computation.9, metadata={op_name="jit(run)/optimizer/add"}
  %input_reduce_fusion = f32[8]{0} fusion(%a), kind=kInput, calls=%fused_computation.10, metadata={op_name="jit(run)/jvp(bert)/reduce_sum"}
  ROOT %tuple = () tuple()
}
"""


def kernel(name, ts, dur, hlo_op=None):
    args = {"hlo_module": "jit_run", **({"hlo_op": hlo_op} if hlo_op else {})}
    return {"ph": "X", "pid": 1, "tid": 14, "name": name, "ts": ts, "dur": dur, "args": args}


def write_profile(tmp_path, steps=2, wall_s=250e-6):
    """Two steps of 125 µs wall time each: 100 µs of kernels, then 25 µs idle (between the steps: the
    device idle; after the second: the traced window's edge)."""
    events = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
              {"ph": "M", "pid": 1, "tid": 14, "name": "thread_name", "args": {"name": "Stream #14(Compute)"}},
              {"ph": "M", "pid": 1, "tid": 99, "name": "thread_name", "args": {"name": "XLA Ops"}},
              {"ph": "M", "pid": 7, "name": "process_name", "args": {"name": "/host:CPU"}}]
    for s in range(steps):
        t = s * 125.0
        events += [kernel("loop_select_fusion", t, 10, "loop_select_fusion"),          # dropout
                   kernel("nvjet_sm90_tst_128x128", t + 10, 30, "custom-call.7"),     # a matmul
                   kernel("gemm_fusion_dot_3", t + 40, 15),                             # named by kernel: attention
                   kernel("loop_transpose_fusion", t + 55, 5, "loop_transpose_fusion"),  # a copy
                   kernel("loop_add_fusion_4", t + 60, 10),                             # optimizer
                   kernel("input_reduce_fusion", t + 70, 20, "input_reduce_fusion"),    # other
                   kernel("memcpy128", t + 90, 10),                                     # no HLO: a copy by name
                   {"ph": "X", "pid": 1, "tid": 99, "name": "fusion", "ts": t, "dur": 90, "args": {}},  # derived line
                   {"ph": "X", "pid": 7, "tid": 3, "name": "PjitFunction", "ts": t, "dur": 120}]
    trace_dir = tmp_path / "plugins" / "profile" / "2026_11_28"
    trace_dir.mkdir(parents=True)
    with gzip.open(trace_dir / "host.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    (tmp_path / profile.HLO_FILE).write_text(HLO)
    (tmp_path / profile.META_FILE).write_text(json.dumps({"steps": steps, "wall_s": wall_s, "label": "a GPU-like step",
                                                          "step_time_median_s": 120e-6}))


def test_reduces_a_gpu_trace_into_rows(tmp_path):
    write_profile(tmp_path)
    table = profile.reduce_profile(tmp_path)
    rows = {r["row"]: r for r in table["rows"]}
    assert list(rows) == list(profile.ROWS)
    expected_us = {"dropout": 10, "matrix products": 30, "attention": 15, "copies/transposes": 15, "optimizer": 10,
                   "other fusions": 20, "host gaps": 12.5}  # the 25 µs between the steps, over two steps
    for row, us in expected_us.items():
        assert rows[row]["ms_per_step"] == pytest.approx(us / 1e3), row
        assert rows[row]["share"] == pytest.approx(us / 112.5), row  # of the kernels' span: 225 µs, two steps
    assert sum(r["share"] for r in table["rows"]) == pytest.approx(1.0)
    assert table["kernels"] == 14 and table["matched"] == 12 and table["events"] == "device"
    assert table["traced_step_ms"] == pytest.approx(0.125) and table["step_ms"] == pytest.approx(0.12)
    assert table["kernel_span_ms"] == pytest.approx(0.1125) and table["edges_ms"] == pytest.approx(0.0125)
    assert rows["matrix products"]["kernels"] == 2 and rows["matrix products"]["top"][0][0] == "custom-call.7"
    assert table["per_kernel"]["custom-call.7"] == pytest.approx((0.03, 1.0))  # ms and runs a step
    assert table["per_kernel"]["input_reduce_fusion"] == pytest.approx((0.02, 1.0))
    text = profile.markdown(table)
    assert "| dropout | 0.01 | 8.9% | 1 | loop_select_fusion 0.01 |" in text and "a GPU-like step" in text
    assert "0.1 ms each from their first kernel to their last" in text


def test_scopes_are_matched_whole_and_through_transforms():
    assert profile.in_scope("jit(run)/transpose(jvp(attention))/dot_general", "attention")
    assert profile.in_scope("jit(run)/optimizer/add", "optimizer")
    assert not profile.in_scope("jit(run)/self_attention_out/add", "attention")
    assert not profile.in_scope("jit(run)/dropout_free/add", "dropout")


@pytest.mark.slow  # ~20 s: a compile, and a CPU trace (XLA's thunk events, which one loaded run lacked)
def test_the_command_reduces_a_real_cpu_profile(tmp_path, capsys):
    where = tmp_path / "prof"
    step.main(["--size", "tiny", "--seq_len", "16", "--batch_size", "2", "--vocab_size", "256", "--steps", "1",
               "--mesh", "1,1,1", "--warmup", "1", "--profile", str(where), "--profile_steps", "2"])
    capsys.readouterr()
    table = profile.main([str(where)])
    assert table["events"] == "host" and table["steps"] == 2 and table["kernels"] > 0
    assert table["matched"] == table["kernels"]  # every XLA thunk named by the compiled HLO
    rows = {r["row"]: r for r in table["rows"]}
    assert rows["matrix products"]["ms_per_step"] > 0 and rows["optimizer"]["ms_per_step"] > 0
    assert sum(r["share"] for r in table["rows"]) <= 1.0 + 1e-9
    assert "| matrix products |" in capsys.readouterr().out


def test_a_cpu_trace_with_libtpus_megascale_process_is_read_as_the_host():
    """Where libtpu is installed, a CPU trace also holds "/device:CUSTOM:Megascale Trace": no device."""
    thunk = {"ph": "X", "pid": 7, "tid": 1, "name": "dot.3", "ts": 0, "dur": 5, "args": {"hlo_op": "dot.3"}}
    process = lambda pid, name: {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": name}}  # noqa: E731
    trace = {"traceEvents": [process(2, "/device:CUSTOM:Megascale Trace"), process(7, "/host:CPU"), thunk]}
    assert profile.kernel_events(trace) == ([thunk], "host")


def test_a_directory_without_a_profile_is_one_line(tmp_path, capsys):
    from input_pipeline.command_line import UserError

    with pytest.raises(UserError, match=r"profile.json: not found \(expected the directory that python -m "
                                        r"bert_jax.benchmark --profile DIR wrote\)"):
        profile.main([str(tmp_path)])


LIBRARY_HLO = """HloModule jit_run, entry_computation_layout={()->()}

ENTRY %main () -> () {
  %loop_add_fusion = bf16[8,4]{1,0} fusion(%a), kind=kLoop, calls=%fused_computation.1, metadata={op_name="jit(run)/jvp()/add"}
  %custom-call.1 = (bf16[8,8]{1,0}, s8[4]{0}) custom-call(%a, %b), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(run)/jvp(attention)/dot_general"}
  %custom-call.2 = (bf16[8,8]{1,0}, s8[4]{0}) custom-call(%a, %b), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(run)/jvp()/dot_general"}
  ROOT %tuple = () tuple()
}
"""


@pytest.mark.parametrize("extra", [False, True], ids=["joined", "a-step-with-another-product"])
def test_cublas_kernels_are_joined_to_their_calls_in_order(tmp_path, extra):
    """cuBLAS names its kernels after their tiling, and inside a CUDA graph the trace names no
    instruction: the n-th product kernel of each step is the program's n-th cuBLAS call (a split-K
    product's reduction kernel counts with it, not as a run; cuDNN's attention kernel is no product),
    so a call in the attention scope is attention's; where the kernels do not come in whole runs of the calls, nothing is guessed."""
    events = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
              {"ph": "M", "pid": 1, "tid": 14, "name": "thread_name", "args": {"name": "Stream #14(Compute)"}}]
    for s in range(2):
        t = s * 100.0
        events += [kernel("loop_add_fusion", t, 10, "command_buffer_1"),
                   kernel("nvjet_sm90_tst_128x64_NNT", t + 10, 20, "command_buffer_1"),  # custom-call.1
                   kernel("nvjet_sm90_tst_192x192_splitK_NTN", t + 30, 30, "command_buffer_1"),  # custom-call.2
                   kernel("void cublasLt::splitKreduce_kernel<32, 16>", t + 60, 5, "command_buffer_1"),
                   kernel("cudnn_generated_sdpa_sm90_flash_fprop_wgmma", t + 65, 10, "command_buffer_1")]
    if extra:
        events.append(kernel("nvjet_sm90_tst_64x64_TNT", 200, 5, "command_buffer_1"))
    trace_dir = tmp_path / "plugins" / "profile" / "2026_11_29"
    trace_dir.mkdir(parents=True)
    with gzip.open(trace_dir / "host.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    (tmp_path / profile.HLO_FILE).write_text(LIBRARY_HLO)
    (tmp_path / profile.META_FILE).write_text(json.dumps({"steps": 2, "wall_s": 200e-6}))
    table = profile.reduce_profile(tmp_path)
    per_kernel, rows = table["per_kernel"], {r["row"]: r["ms_per_step"] * 1e3 for r in table["rows"]}
    if extra:
        assert "custom-call.1" not in per_kernel and table["matched"] == 2  # the two fusions, by name
        assert rows["attention"] == pytest.approx(10)  # cuDNN's kernel, by its name
        return
    assert per_kernel["custom-call.1"] == (0.020, 1.0)
    assert per_kernel["custom-call.2"] == (0.035, 1.0)  # the product and its split-K reduction: one run
    assert table["matched"] == 8
    assert rows["attention"] == pytest.approx(20 + 10) and rows["matrix products"] == pytest.approx(35)
