"""Agreement with llama.cpp on a model: token ids, logits, greedy tokens and the chat template, side by side.

`python run.py agree --model NAME` runs llama.cpp (llama-cpp-python, the bench extra) on a fixed text, TEP alarm lines
and a loghub excerpt, and saves what it computed as a small fixture (`--fixture-out`: the text, llama.cpp's token ids,
its top-8 logits and next-token log-probabilities at every position, its greedy continuation, and its renderings of
a chat); then, or from a saved fixture alone (`--fixture`), runs ringspec's tokenizer, engine and chat frame on the
same text and prints the comparison. The pair tier (`pytest -m pair`) holds ringspec to the committed fixtures in
tests/fixtures/. Owns only this comparison; never changes a model.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench import llama_build, speed
from kernels.sampling import SamplingParams
from models.gguf import sha256_file
from models.handle import Model
from models.tokenizer import Tokenizer
from pipeline import config
from pipeline.decode.assemble import make_engine
from pipeline.stream.records import read_log, render
from run import ROOT

SHARED = ROOT.parent / "shared"
TOP_K = 8
CONTINUATION = 32
TEP_LINES, LOGHUB_LINES = 24, 16
CHAT = [{"role": "user", "content": "01:32:20 AIR003_3 H PURGE C CONC HIGH ALM\nWhat alarm is this?"}]
CHAT_WITH_SYSTEM = [{"role": "system", "content": "You watch a plant's alarm log."}] + CHAT


def fixed_text() -> str:
    """The compared text: the bundled TEP log's first lines as the pipeline renders them, then a Linux syslog
    excerpt (loghub)."""
    tep = render(read_log(ROOT / "data" / "tep_demo.csv"))
    syslog = (SHARED / "data" / "loghub" / "Linux_2k.log").read_text().splitlines()
    return "\n".join(tep.splitlines()[:TEP_LINES] + syslog[:LOGHUB_LINES]) + "\n"


def llama_cpp_fixture(gguf: Path, text: str, threads: int = 2) -> dict:
    """What llama.cpp computes on `text` (all logits in one causal pass, flash attention, `threads` threads)."""
    llama_cpp = speed.llama_cpp(build=True)     # this environment's, or built for this CPU (bench/llama_build.py)
    if llama_cpp is None:
        raise SystemExit(f"agree: llama.cpp does not run here ({llama_build.chosen().reason}); compare against a "
                         "saved fixture with --fixture")
    Jinja2ChatFormatter = llama_cpp.llama_chat_format.Jinja2ChatFormatter
    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=4096, n_threads=threads, n_threads_batch=threads, n_batch=512,
                          logits_all=True, flash_attn=True, verbose=False)
    ids = llm.tokenize(text.encode(), add_bos=False, special=False)
    llm.eval(ids)
    logits = np.array(llm.scores[:len(ids)], dtype=np.float32)
    top = np.argsort(-logits, axis=-1)[:, :TOP_K]
    logp = logits.astype(np.float64) - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    nxt = logp[np.arange(len(ids) - 1), ids[1:]]
    continuation = []
    for _ in range(CONTINUATION):               # greedy: the argmax of each new row
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        continuation.append(token)
        llm.eval([token])
    template = llm.metadata["tokenizer.chat_template"]
    jinja = Jinja2ChatFormatter(template, eos_token="", bos_token="")

    def rendered(messages) -> str:
        return jinja(messages=messages).prompt

    def builtin(messages) -> str:               # llama.cpp's own C++ renderer (no default system prompt)
        chat = (llama_cpp.llama_chat_message * len(messages))(
            *[llama_cpp.llama_chat_message(role=m["role"].encode(), content=m["content"].encode()) for m in messages])
        buf = bytes(4096)
        n = llama_cpp.llama_chat_apply_template(template.encode(), chat, len(messages), True, buf, len(buf))
        return buf[:n].decode()

    return {"text": text, "token_ids": np.array(ids, np.int32), "topk_ids": top.astype(np.int32),
            "topk_logits": np.take_along_axis(logits, top, -1), "next_token_logprob": nxt.astype(np.float32),
            "greedy_continuation_ids": np.array(continuation, np.int32),
            "chat_jinja": rendered(CHAT), "chat_jinja_system": rendered(CHAT_WITH_SYSTEM),
            "chat_builtin_system": builtin(CHAT_WITH_SYSTEM), "model_sha256": sha256_file(gguf),
            "producer": f"llama-cpp-python {llama_cpp.__version__} ({_build()}), {threads} threads, flash attention"}


def _build() -> str:
    """Which llama.cpp build computed a fixture: the environment's, or the one built here with its options."""
    build = llama_build.chosen()
    return build.source + (f": {' '.join(build.cmake_args)}" if build.cmake_args else "")


@dataclass
class Agreement:
    model: str
    n_tokens: int
    token_ids_equal: bool
    top1: float
    nll: float
    nll_llama_cpp: float
    greedy_teacher_forced: bool      # ringspec's argmax along llama.cpp's continuation = that continuation
    greedy_free: list[int]           # ringspec's own greedy continuation
    greedy_llama_cpp: list[int]
    chat_equal: bool
    chat_system_equal: bool
    chat_builtin_equal: bool
    exit_code: int = 0
    indent = None

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "exit_code"}

    def text(self) -> str:
        same = sum(a == b for a, b in zip(self.greedy_free, self.greedy_llama_cpp))
        lead = next((i for i, (a, b) in enumerate(zip(self.greedy_free, self.greedy_llama_cpp)) if a != b),
                    len(self.greedy_free))
        return "\n".join([
            f"{self.model}: {self.n_tokens} tokens (TEP alarm lines, Linux syslog lines)",
            f"  token ids equal to llama.cpp's: {self.token_ids_equal}",
            f"  top-1 agreement: {self.top1:.4f}",
            f"  mean NLL: ringspec {self.nll:.5f}, llama.cpp {self.nll_llama_cpp:.5f} "
            f"({(self.nll - self.nll_llama_cpp) / self.nll_llama_cpp:+.2%})",
            f"  greedy along llama.cpp's continuation: {'identical' if self.greedy_teacher_forced else 'differs'}; "
            f"free greedy: {lead} leading tokens equal, {same}/{len(self.greedy_free)} in place",
            f"  chat template (Jinja, default system prompt) equal: {self.chat_equal}; with a system message: "
            f"{self.chat_system_equal}; llama.cpp's built-in renderer with a system message: "
            f"{self.chat_builtin_equal}"])

    def notes(self) -> str:
        return ""


def compare(fx, model: str, threads: int = 2, kernel: str = "nbits", kv_dtype: str = "auto") -> Agreement:
    """ringspec (the profile's engine: accuracy level 4, full cache; `kernel`: its linears'; `kv_dtype`: its pools')
    against a fixture's figures."""
    gguf = Model.of(model).gguf
    tok = Tokenizer.from_gguf(gguf)
    ids = np.asarray(fx["token_ids"], np.int64)
    n = len(ids)
    cont = np.asarray(fx["greedy_continuation_ids"], np.int64)
    cfg = config.override(config.parse({}), {"model.gguf": model, "model.threads": threads, "draft.kind": "none",
                                             "cache.sink": 0, "cache.window": n + len(cont) + 8,
                                             "model.kernel": kernel, "model.kv_dtype": kv_dtype})
    engine = make_engine(cfg)
    rows: list[np.ndarray] = []
    engine.feed(np.concatenate([ids, cont]), on_logits=lambda start, logits: rows.append(logits.copy()))
    logits = np.concatenate(rows)
    logp = logits[:n].astype(np.float64) - logits[:n].max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    fresh = make_engine(cfg, check_rows=False)
    free = fresh.generate(ids, len(cont), SamplingParams()).token_ids
    return Agreement(
        model=model, n_tokens=n, token_ids_equal=bool(np.array_equal(tok.encode(str(fx["text"])), ids)),
        top1=float((logits[:n].argmax(-1) == np.asarray(fx["topk_ids"])[:, 0]).mean()),
        nll=float(-logp[np.arange(n - 1), ids[1:]].mean()),
        nll_llama_cpp=float(-np.asarray(fx["next_token_logprob"], np.float64).mean()),
        greedy_teacher_forced=bool(np.array_equal(logits[n - 1:n - 1 + len(cont)].argmax(-1), cont)),
        greedy_free=list(map(int, free)), greedy_llama_cpp=list(map(int, cont)),
        chat_equal=tok.chat_text(CHAT) == str(fx["chat_jinja"]),
        chat_system_equal=tok.chat_text(CHAT_WITH_SYSTEM) == str(fx["chat_jinja_system"]),
        chat_builtin_equal=tok.chat_text(CHAT_WITH_SYSTEM) == str(fx["chat_builtin_system"]))


def run_agree(model: str, fixture: str | None, fixture_out: str | None, threads: int,
              kernel: str = "nbits", kv_dtype: str = "auto") -> Agreement:
    """ringspec against llama.cpp on one model: the same text's token ids, top-1 agreement and mean NLL of the
    logits, greedy tokens, and the chat template as llama.cpp renders it.

    llama.cpp runs here (llama-cpp-python, the bench extra) unless --fixture names figures saved before by
    --fixture-out; the pair tier (pytest -m pair) reads the fixtures committed in tests/fixtures/."""
    if fixture:
        fx = dict(np.load(fixture))
    else:
        fx = llama_cpp_fixture(Model.of(model).gguf, fixed_text(), threads)
        if fixture_out:
            np.savez_compressed(fixture_out, **fx)
    return compare(fx, model, threads, kernel, kv_dtype)
