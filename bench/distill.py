"""Distilling a neural draft from the target: the training set, the sub-vocabulary, the training run.

Owns the recipe behind `python run.py distill`:
  corpus   training logs rendered as replay renders them (the bench's log is held out, by content), plus the
           target's own greedy continuations of windows of them for both bench tasks (the text a draft must predict)
  vocab    the most frequent target tokens of that corpus; the rest map to the draft's "other" id
  train    a small llama (models.draftnet) on next-token loss over both, on two cores, for a fixed budget of steps
  export   a Q8_0 GGUF with the vocabulary map, cached under $RINGSPEC_HOME/drafts
Needs the `train` extra (torch, transformers). Never runs while serving; never reads the held-out log. `run_distill` is
the `distill` verb: the recipe checked first, progress bars on stderr, the figures in `DistillReport`.
"""
from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from bench.speed import TASKS, prompts, rendered
from kernels.sampling import SamplingParams
from models.draftnet import OTHER, DraftShape, build, export, snap_to_q8, training_stack, vocab_map
from models.gguf import sha256_file
from models.handle import Model
from models.registry import home
from pipeline import config
from pipeline.decode.assemble import make_engine
from pipeline.report import Report


@dataclass(frozen=True)
class Recipe:
    logs: int = 40                  # training logs used (of those not held out), spread over the directory
    continuations: int = 2          # target continuations per training log and task
    seq: int = 256                  # training sequence length
    batch: int = 16
    steps: int = 600
    lr: float = 3e-3
    continuation_share: float = 0.5 # share of each batch drawn from the target's continuations
    check_every: int = 150          # steps between agreement checks on the kept-out continuations
    eval_logs: int = 4              # training-set logs whose continuations are kept out of training, for the figures
    seed: int = 0


def _digest(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def training_logs(root, held_out=(), n: int | None = None) -> list[str]:
    """CSV logs under `root` whose bytes differ from every held-out file, `n` of them spread evenly (sorted names)."""
    root = Path(root)
    banned = {_digest(p) for p in held_out}
    logs = [str(p) for p in sorted(root.rglob("*.csv")) if _digest(p) not in banned]
    if not logs:
        raise FileNotFoundError(f"no training logs under {root} (held out: {', '.join(map(str, held_out))})")
    if n is not None and n < len(logs):
        logs = [logs[i] for i in np.linspace(0, len(logs) - 1, n).round().astype(int)]
    return logs


def target_continuations(logs, per_log: int, progress=None) -> list[dict]:
    """The target's greedy output for `per_log` bench-style prompts of each log and task: [{log, task, ids, start}]
    with ids = prompt + output and start = where the output begins. Uses the serial engine with the stream draft
    (its tokens are target-only's, which the bench checks)."""

    engine = make_engine(config.override(config.parse({}), {"draft.kind": "suffix"}))   # the defaults' ring
    out = []
    jobs = [(log, task) for log in logs for task in TASKS]
    for i, (log, task) in enumerate(jobs):
        for p in prompts(log, task, per_log):
            engine.reset()
            res = engine.generate(np.asarray(p.ids, np.int64), p.new_tokens, SamplingParams(), stop_ids=p.stop_ids)
            out.append({"log": Path(log).name, "task": task, "ids": np.asarray(p.ids + tuple(res.token_ids)),
                        "start": len(p.ids)})
        if progress:
            progress(i + 1, len(jobs))
    return out


def choose_vocab(streams, size: int, keep=()) -> np.ndarray:
    """Draft id -> target id: OTHER (-1) first, then `keep`, then the most frequent tokens of `streams`."""
    counts = np.bincount(np.concatenate([np.asarray(s) for s in streams]))
    order = [t for t in np.argsort(-counts, kind="stable") if counts[t] > 0 and t not in set(keep)]
    ids = [-1, *keep, *order][:size]
    return np.asarray(ids + [-1] * (size - len(ids)), np.int32)


def coverage(target_ids, streams) -> float:
    inside = set(int(t) for t in target_ids if t >= 0)
    flat = np.concatenate([np.asarray(s) for s in streams])
    return float(np.isin(flat, list(inside)).mean())


def _windows(rng, conts, raw, recipe: Recipe, n: int) -> np.ndarray:
    """n training windows of seq + 1 target ids: a share ending inside a continuation's output, the rest raw log."""
    out = np.zeros((n, recipe.seq + 1), np.int64)
    n_cont = int(round(n * recipe.continuation_share)) if conts else 0
    for i in range(n):
        if i < n_cont:
            c = conts[rng.integers(len(conts))]
            ids, lo = c["ids"], max(c["start"] + 1, recipe.seq + 1)
            end = int(rng.integers(lo, len(ids) + 1)) if lo <= len(ids) else len(ids)
        else:
            ids = raw[rng.integers(len(raw))]
            end = int(rng.integers(recipe.seq + 1, len(ids) + 1))
        w = ids[max(0, end - recipe.seq - 1):end]
        out[i, -len(w):] = w
    return out


def agreement(model, conts, to_draft, target_ids) -> dict:
    """Top-1 agreement of the draft with the target on the target's own output, teacher-forced (the chance a draft
    token is accepted when the tokens before it were), per task."""
    torch = training_stack()[0]

    hits: dict[str, list[float]] = {}
    model.eval()
    with torch.no_grad():
        for c in conts:
            ids = c["ids"][-1024:]
            start = c["start"] - (len(c["ids"]) - len(ids))
            logits = model(torch.from_numpy(to_draft[ids][None])).logits[0].numpy()
            logits[:, OTHER] = -np.inf
            guess = np.asarray(target_ids)[logits.argmax(-1)]
            hits.setdefault(c["task"], []).append(float((guess[start - 1:-1] == ids[start:]).mean()))
    model.train()
    return {task: float(np.mean(v)) for task, v in hits.items()}


def train(shape: DraftShape, recipe: Recipe, raw, conts, to_draft, progress=None, check=None):
    """A draft trained on next-token loss over `raw` log streams and the target's continuations `conts` (target ids,
    mapped by `to_draft`); returns (model, history). Two threads; `progress(step, loss)` every 50 steps.

    check = (continuations kept out, target_ids): every `recipe.check_every` steps the draft's agreement with the
    target on them goes into the history. It is a figure, not a selector: on so few continuations it moves by
    +-5 points from check to check, and the best-scoring checkpoint was the worse draft on the bench log."""
    torch = training_stack()[0]

    torch.set_num_threads(2)
    rng = np.random.default_rng(recipe.seed)
    model = build(shape, recipe.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.01, betas=(0.9, 0.95))
    warm = max(1, recipe.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) *
                                              0.5 * (1 + np.cos(np.pi * min(1.0, s / recipe.steps))))
    history, smooth = [], None
    for step in range(recipe.steps):
        batch = torch.from_numpy(to_draft[_windows(rng, conts, raw, recipe, recipe.batch)])
        logits = model(batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, shape.vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        value = loss.item()
        smooth = value if smooth is None else 0.98 * smooth + 0.02 * value
        if (step + 1) % 50 == 0 or step + 1 == recipe.steps:
            history.append({"step": step + 1, "loss": round(smooth, 4)})
            if check and ((step + 1) % recipe.check_every == 0 or step + 1 == recipe.steps):
                agree = agreement(model, check[0], to_draft, check[1])
                history[-1]["agreement"] = {k: round(v, 4) for k, v in agree.items()}
            if progress:
                progress(step + 1, smooth)
    model.eval()
    return model, history


def corpus(logs, recipe: Recipe, gguf: str = "default", progress=None) -> tuple[list[np.ndarray], list[dict]]:
    """(raw token streams of the logs, the target's continuations): cached under $RINGSPEC_HOME/distill by the
    logs' bytes, the model file and the recipe's continuation count."""

    key = hashlib.sha256(json.dumps([[_digest(p) for p in logs], sha256_file(Model.of(gguf).gguf),
                                     recipe.continuations]).encode()).hexdigest()[:16]
    path = home() / "distill" / f"corpus-{key}.npz"
    raw = [rendered(log, gguf, None)[1] for log in logs]
    if path.exists():
        if progress:
            progress(len(logs) * len(TASKS), len(logs) * len(TASKS))      # nothing left to generate
        z = np.load(path)
        cuts = np.cumsum(z["lengths"])[:-1]
        conts = [{"log": log, "task": task, "ids": ids, "start": int(start)} for log, task, ids, start in
                 zip(z["logs"], z["tasks"], np.split(z["ids"], cuts), z["starts"])]
        return raw, conts
    conts = target_continuations(logs, recipe.continuations, progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part.npz")
    np.savez(tmp, ids=np.concatenate([c["ids"] for c in conts]), lengths=[len(c["ids"]) for c in conts],
             starts=[c["start"] for c in conts], tasks=[c["task"] for c in conts], logs=[c["log"] for c in conts])
    tmp.replace(path)
    return raw, conts


def distill(root, held_out, out, shape: DraftShape = DraftShape(), recipe: Recipe = Recipe(), gguf: str = "default",
            progress=None) -> dict:
    """The whole recipe; writes the draft GGUF to `out` and its report beside it (`.json`), returns the report.
    `progress(stage, done, total, note)` is called through every stage."""

    t0 = time.perf_counter()
    logs = training_logs(root, held_out, recipe.logs)
    if progress:
        progress("continuations", 0, len(logs) * 2, "")       # both bench tasks
    raw, conts = corpus(logs, recipe, gguf, lambda i, n: progress and progress("continuations", i, n, ""))
    names = sorted({Path(c["log"]).name for c in conts})
    kept_out = set(names[:: max(1, len(names) // recipe.eval_logs)][: recipe.eval_logs])
    train_conts = [c for c in conts if Path(c["log"]).name not in kept_out]
    eval_conts = [c for c in conts if Path(c["log"]).name in kept_out]
    tok = rendered(logs[0], gguf, None)[0]
    target_ids = choose_vocab(raw + [c["ids"] for c in train_conts], shape.vocab, keep=[int(t) for t in tok.stop_ids])
    to_draft = vocab_map(target_ids, tok.vocab_size)
    t1 = time.perf_counter()
    if progress:
        progress("train", 0, recipe.steps, "")
    model, history = train(shape, recipe, raw, train_conts, to_draft,
                           lambda s, loss: progress and progress("train", s, recipe.steps, f"loss {loss:.3f}"),
                           check=(eval_conts, target_ids))
    t2 = time.perf_counter()
    snap_to_q8(model)                                    # the figures below are the exported weights'
    report = {
        "shape": asdict(shape), "recipe": asdict(recipe),
        "logs": [Path(p).name for p in logs], "held_out": [str(p) for p in held_out],
        "eval_logs": sorted(kept_out),
        "raw_tokens": int(sum(len(r) for r in raw)), "continuations": len(train_conts),
        "continuation_tokens": int(sum(len(c["ids"]) - c["start"] for c in train_conts)),
        "vocab_coverage": {"train": coverage(target_ids, [c["ids"][c["start"]:] for c in train_conts]),
                           "eval": coverage(target_ids, [c["ids"][c["start"]:] for c in eval_conts])},
        "agreement": agreement(model, eval_conts, to_draft, target_ids),
        "corpus_s": round(t1 - t0, 1), "train_s": round(t2 - t1, 1), "history": history,
        "loss": history[-1]["loss"],
    }
    path = export(model, shape, target_ids, Model.of(gguf).gguf, out,
                  meta={"recipe": json.dumps(asdict(recipe)), "agreement": json.dumps(report["agreement"])})
    report["gguf"], report["bytes"] = str(path), path.stat().st_size
    Path(out).with_suffix(".json").write_text(json.dumps(report, indent=1))
    return report


@dataclass
class DistillReport(Report):
    """`distill`'s report (also written beside the GGUF as .json): size, training, coverage and agreement."""

    def text(self) -> str:
        rep, shape = self.data, self.data["shape"]
        agree = ", ".join(f"{task} {v:.1%}" for task, v in rep["agreement"].items())
        cover = rep["vocab_coverage"]
        return "\n".join([
            (f"{rep['gguf']} ({rep['bytes'] / 1e6:.1f} MB): {shape['n_layers']} layers, d {shape['d_model']}, "
             f"{shape['vocab']} ids"),
            (f"trained on {len(rep['logs'])} logs: {rep['raw_tokens']} log tokens, {rep['continuations']} target "
             f"continuations ({rep['continuation_tokens']} tokens); corpus {rep['corpus_s']} s, training "
             f"{rep['train_s']} s, final loss {rep['loss']}"),
            (f"sub-vocabulary covers {cover['eval']:.1%} of the target's held-out output; top-1 agreement with the "
             f"target on it: {agree}"),
            f"measure it: python run.py bench --draft-model {rep['gguf']}"])


def run_distill(logs, held_out, out=None, train_logs: int = Recipe.logs, continuations: int = Recipe.continuations,
                steps: int = Recipe.steps, vocab: int = DraftShape.vocab, d_model: int = DraftShape.d_model,
                layers: int = DraftShape.n_layers) -> DistillReport:
    """Builds a training set from TEP logs (rendered as replay renders them) and the target's greedy continuations of
    them for both bench tasks, chooses the draft's sub-vocabulary (the most frequent target tokens; the rest have
    draft probability 0), trains a small llama on two cores and writes it as a Q8_0 GGUF with a JSON report beside it
    (vocabulary coverage, the draft's top-1 agreement with the target on held-out continuations, the loss curve). The
    continuations are cached under $RINGSPEC_HOME/distill. The held-out logs (the bench's, by default) are skipped by
    content. Measure the result with `bench --draft-model OUT`.

    The recipe is checked before any work; out defaults to $RINGSPEC_HOME/drafts/distilled.gguf."""
    sizes = {"steps": steps, "vocab": vocab, "d_model": d_model, "layers": layers, "train_logs": train_logs,
             "continuations": continuations}
    for name, value in sizes.items():
        if value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if d_model % 64:
        raise ValueError("--d-model must be a multiple of 64 (heads of 64, Q8_0 blocks of 32)")

    shape = DraftShape(vocab=vocab, d_model=d_model, n_layers=layers, d_ff=3 * d_model, n_heads=d_model // 64,
                       n_kv_heads=max(1, d_model // 128))
    recipe = Recipe(logs=train_logs, continuations=continuations, steps=steps)
    path = Path(out) if out else home() / "drafts" / "distilled.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)
    bars: dict = {}

    def progress(stage, done, total, note):
        bar = bars.get(stage) or bars.setdefault(stage, tqdm(total=total, desc=stage, file=sys.stderr))
        bar.update(done - bar.n)
        if note:
            bar.set_postfix_str(note)

    report = distill(logs, held_out, path, shape, recipe, progress=progress)
    for bar in bars.values():
        bar.close()
    return DistillReport(report)
