"""The speed benchmark's protocol: prompts, the repetition-loop measure, the agreement rule, and one real run."""
import json
import sys

import numpy as np
import pytest

from bench import speed
from tests import procs

ROOT = speed.__file__.rsplit("/bench/", 1)[0]


def test_loop_share_counts_back_to_back_repeats_only():
    assert speed.loop_share([1, 2, 3] * 10) == 1.0
    assert speed.loop_share(list(range(50))) == 0.0
    text = list(range(20)) + [7, 8] * 8 + list(range(100, 120))     # 16 looped tokens out of 56
    assert speed.loop_share(text) == pytest.approx(16 / 56)
    assert speed.loop_share([5, 6, 5, 6] + list(range(30))) == 0.0  # two copies, shorter than the minimum span


def test_prompts_are_line_aligned_windows_framed_per_task(default_gguf):
    from models.tokenizer import Tokenizer
    tok = Tokenizer.from_gguf(default_gguf)
    log = f"{ROOT}/data/tep_demo.csv"
    logs, asks = speed.prompts(log, "log", 5), speed.prompts(log, "analysis", 5)
    assert len(logs) == 5 and all(len(p.ids) == 512 and p.new_tokens == 256 and not p.stop_ids for p in logs)
    assert [p.offset for p in logs] == [p.offset for p in asks]
    first = tok.decode(list(logs[2].ids[:12]))
    assert first[2] == ":" and first[5] == ":"                          # starts at a line: "HH:MM:SS ..."
    text = tok.decode(list(asks[0].ids))
    assert text.endswith("Summarise the most severe alarms above.<|im_end|>\n<|im_start|>assistant\n")
    assert asks[0].new_tokens == 128 and asks[0].stop_ids


def _runs(ids_by_system):
    return {name: [{"prompt": k, "token_ids": ids, "tokens_per_s": 10.0, "ttft_ms": 5.0, "accepted_per_verify": 1.0,
                    "overhead_share": 0.1, "peak_mb": 100.0} for k, ids in enumerate(prompts)]
            for name, prompts in ids_by_system.items()}


def test_a_ringspec_system_that_differs_from_target_only_is_an_error():
    chosen = [speed.System("target_only", "ringspec"), speed.System("suffix_serial", "ringspec", "suffix"),
              speed.System("llama_cpp_plain", "llama_cpp")]
    fine = speed._table(chosen, _runs({"target_only": [[1, 2, 3]], "suffix_serial": [[1, 2, 3]],
                                      "llama_cpp_plain": [[1, 2, 4]]}))
    assert fine["llama_cpp_plain"]["identical_to_target_only"] == 0          # llama.cpp may differ: reported
    assert fine["suffix_serial"]["agreement_with_llama_cpp"] == pytest.approx(2 / 3)
    with pytest.raises(speed.Disagreement, match="suffix_serial differs from target_only on prompt 0 at token 2"):
        speed._table(chosen, _runs({"target_only": [[1, 2, 3]], "suffix_serial": [[1, 2, 9]],
                                    "llama_cpp_plain": [[1, 2, 3]]}))
    runs = _runs({"target_only": [[1, 2, 3]], "suffix_serial": [[1, 9, 9]], "llama_cpp_plain": [[1, 2, 3]]})
    runs["suffix_serial"].append({**runs["suffix_serial"][0], "token_ids": [1, 2, 3]})   # a later repeat agrees
    with pytest.raises(speed.Disagreement, match="at token 1"):                         # the first still counts
        speed._table(chosen, runs)


def test_goals_take_the_fastest_ringspec_system_and_say_by_how_much():
    out = {"log": {"target_only": {"tokens_per_s": 70.0}, "suffix_serial": {"tokens_per_s": 150.0},
                   "llama_cpp_plain": {"tokens_per_s": 100.0}, "llama_cpp_lookup": {"tokens_per_s": 200.0}},
           "analysis": {"target_only": {"tokens_per_s": 90.0}, "suffix_serial": {"tokens_per_s": 120.0}}}
    got = {(g["task"], g["against"]): g for g in speed.goals(out)}
    assert set(got) == {("log", "llama_cpp_plain"), ("log", "llama_cpp_lookup"), ("analysis", "target_only")}
    assert got["log", "llama_cpp_plain"]["system"] == "suffix_serial"           # llama.cpp never counts as ours
    assert got["log", "llama_cpp_plain"]["ratio"] == pytest.approx(1.5) and not got["log", "llama_cpp_plain"]["met"]
    assert got["analysis", "target_only"]["ratio"] == pytest.approx(4 / 3) and got["analysis", "target_only"]["met"]


def test_bench_runs_every_system_on_the_real_model_and_prints_the_json_contract(default_gguf, tmp_path):
    # llama.cpp left out: whether a build for this CPU sits in the cache is this machine's state, not the code's
    # (its systems: tests/bench/test_llama_build.py, and the speculative peer below when one is there)
    proc = procs.run([sys.executable, f"{ROOT}/run.py", "bench", "--task", "log", "--offsets", "1", "--repeats", "1",
                      "--json", "--new-tokens", "48", "--no-llama-cpp", "--out", str(tmp_path / "speed.json")])
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert set(out) == {"log", "_meta"}
    meta = out.pop("_meta")
    assert meta["exactness"]["target_only"]["invariant"] and meta["platform"]["onnxruntime"]
    ringspec = {"target_only", "suffix_serial", "pipelined", "pipelined_tree", "pipelined_adaptive", "adaptive_serial",
                "lines_serial", "tree_serial",
                "draft_serial", "hybrid_serial", "adaptive_hybrid_serial", "hybrid_tree_serial", "pipelined_hybrid",
                "pipelined_model"}
    names = ringspec
    for task in out.values():
        assert set(task) == names
        for name, row in task.items():
            assert row["tokens_per_s"] > 0 and row["ttft_ms"] > 0 and row["peak_mb"] > 50
            if name in ringspec:                     # the distilled draft too, serial and in a draft actor
                assert row["identical_to_target_only"] == row["prompts"] == 1 and row["exact_here"]
    assert json.loads((tmp_path / "speed.json").read_text())["_meta"]["systems"] == meta["systems"]


def test_block_lists_parse_ranges_and_refuse_junk():
    from bench.draftscan import _blocks
    from models.subset import parse_blocks
    assert parse_blocks("0-2,5, 7-8") == [0, 1, 2, 5, 7, 8]
    assert _blocks("0-9:3") == [0, 3, 6, 9]
    for bad in ("a-3", "1-", "2,2", "", "5-3"):
        with pytest.raises(ValueError):
            parse_blocks(bad)
    with pytest.raises(ValueError, match="lo-hi:step"):
        _blocks("0-x:2")


def test_a_draft_holding_every_block_is_always_accepted(default_gguf, tmp_path, monkeypatch):
    """The scan's protocol on the one candidate whose answer is known: a byte copy of the target proposes exactly
    the target's greedy tokens, and the tokens equal target-only's."""
    from bench import draftscan
    monkeypatch.setattr(draftscan, "home", lambda: tmp_path)       # the cut GGUF goes here (its conversion is cached)
    out = draftscan.scan(f"{ROOT}/data/tep_demo.csv", candidates=("0-29",), n_offsets=1, draft_len=3)
    row = out["candidates"]["0-29"]
    assert row["blocks"] == 30 and row["acceptance_rate"] == 1.0 and row["accepted_per_verify"] == 4.0
    assert (tmp_path / "drafts").is_dir()


def test_a_bench_that_would_open_the_npu_in_several_workers_is_refused_before_any_starts(tmp_path):
    from pipeline import config
    profile = tmp_path / "npu.toml"
    profile.write_text('[board]\nnpu = "rknpu2"\n\n[draft]\nkind = "hybrid"\nbackend = "rknn"\n')
    cfg = config.load(str(profile))
    report = speed.run_bench(cfg, str(profile), log=f"{ROOT}/data/tep_demo.csv", llama_cpp=False)
    assert report.exit_code == 2
    assert report.line.startswith("ringspec: bench: 6 processes would open the NPU at once (draft_serial, "
                                  "hybrid_serial, adaptive_hybrid_serial, hybrid_tree_serial, pipelined_hybrid, "
                                  "pipelined_model)")
    assert "--systems NAME" in report.line
    one = speed.select(speed.systems("default-draft", False), ["hybrid_serial"])
    assert speed.npu_openers(one, cfg) == ["hybrid_serial"]                 # one worker holds it: allowed
    assert speed.npu_openers(speed.systems("default-draft", False), config.load(None)) == []    # on the CPU


def test_llama_cpp_speculative_peer_keeps_its_cache_and_changes_no_token(default_gguf):
    """The llama.cpp peer of ringspec's neural draft (bench/llama_draft.py): the model drafting for itself guesses
    exactly llama.cpp's greedy tokens, the speculative run's tokens equal plain llama.cpp's, and each token is
    evaluated by the draft about once (its cache kept between guesses; a draft re-reading the context per guess
    would evaluate prompt x guesses tokens)."""
    lib = speed.llama_cpp()
    if lib is None:
        pytest.skip("llama-cpp-python (the bench extra) is not installed")
    from bench.llama_draft import greedy_draft
    prompt = speed.prompts(f"{ROOT}/data/tep_demo.csv", "log", 1, new_tokens=24)[0]
    draft = greedy_draft(lib, str(default_gguf), 1024, 4, 1)

    def run(draft_model):
        llm = lib.Llama(model_path=str(default_gguf), n_ctx=1024, n_threads=1, draft_model=draft_model,
                        logits_all=draft_model is not None, verbose=False)
        out = []
        for token in llm.generate(list(prompt.ids), top_k=1, temp=0.0, repeat_penalty=1.0):
            out.append(int(token))
            if len(out) == 24:
                return out

    plain = run(None)
    assert draft(np.asarray(prompt.ids, np.intc)).tolist() == plain[:4]       # its own greedy continuation
    assert run(draft) == plain
    assert draft.calls >= 24 // 5 and draft.proposed >= 24 - draft.calls
    assert draft.evaluated < 2 * (len(prompt.ids) + 24 + 4 * draft.calls)


def test_the_profile_keys_given_on_the_command_line_reach_every_worker(monkeypatch):
    """`bench --kernel nbits` over a profile naming the native kernel: the workers build their engines from the
    profile file and the overrides handed to them, so the kernel (and the model) travel with it."""
    from pipeline import config
    seen = {}
    monkeypatch.setattr(speed, "bench", lambda *a, **k: seen.setdefault("profile", a[11]) and {})
    given = {"model.kernel": "nbits", "model.gguf": "qwen2.5-coder-1.5b"}
    cfg = config.override(config.parse({}), given)
    speed.run_bench(cfg, "configs/pair.toml", "data/tep_demo.csv", "log", 1, 1, given=given)
    path, keys = seen["profile"]
    assert path == "configs/pair.toml" and keys["model.kernel"] == "nbits"
    assert config.load(path, keys).model.kernel == "nbits"
