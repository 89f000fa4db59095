"""Which --best_metric keeps the better model: val_mel (teacher-forced) or val_mel_dtw (free-running)?
And how noisy is val_mel_dtw per clip, for the feedback promotion guard? (Not a test.)

    python bench/bench_best_metric.py select --corpora tone,espeak --seeds 1,2,3 --minutes 3
    python bench/bench_best_metric.py guard --minutes 2

select: per corpus and seed, a fresh tiny model (as --demo) is trained by train_vits.py as a
    subprocess for --minutes, saving a checkpoint every --save_seconds and keeping all of them, so
    there is a model for every moment a run could have evaluated. The bench then evaluates every
    checkpoint exactly as the runner does (evaluate.evaluate for val_mel, freerun.free_running_eval
    for val_mel_dtw: same validation split, seeds and sentence counts) and lets each criterion pick
    the checkpoint it would keep. Both picks are judged on a TEST set of unseen sentences, disjoint
    from the training and validation clips, with free-running measures: MCD, DTW-mel, and how far
    the spoken length is from the recorded one (mean |log duration ratio| per sentence); the
    teacher-forced mel on the test clips is reported too. Also: how often the two criteria pick
    different checkpoints, and the Spearman rank correlation of each criterion with the test MCD over
    a run's checkpoints (how well it orders models, not only its single pick).
guard: the per-clip noise of val_mel_dtw next to the teacher-forced per-clip mel the promotion guard
    uses (judgement.py): the same weights scored with seeds 1234 and 1235, and the changes a real
    feedback round (train_feedback.py) makes to the held-out feedback clips, judged with both.

Corpora: "tone" is the built-in tone language (vits_trainer/data/synthetic.py, as --demo); "espeak" is
Kurdish (Kurmanji) sentences spoken by espeak-ng (`apt-get install espeak-ng`; the bench needs it,
the tests do not), resampled to 16 kHz. Neither is a listening test: with no listeners and no
speech recogniser offline, "sounds better" is approximated by distances to the real recordings of
unseen sentences. JSON to bench/results/best_metric_<what>.json.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from vits_trainer.data.clipstore import load_clip_store  # noqa: E402
from vits_trainer.data.items import build_items  # noqa: E402
from vits_trainer.data.loader import make_loader  # noqa: E402
from vits_trainer.data.prepare_state import mark_as_made  # noqa: E402
from vits_trainer.data.sampler import BucketBatchSampler  # noqa: E402
from vits_trainer.data.synthetic import make_corpus  # noqa: E402
from vits_trainer.errors import UserError  # noqa: E402
from vits_trainer.model.tiny import make_tiny_model  # noqa: E402
from vits_trainer.runlock import RunLock  # noqa: E402
from vits_trainer.training.checkpoint import list_checkpoints, verify_checkpoint  # noqa: E402
from vits_trainer.training.config import TrainConfig  # noqa: E402
from vits_trainer.training.demo import DEMO_SETTINGS  # noqa: E402
from vits_trainer.training.evaluate import evaluate, evaluate_per_clip  # noqa: E402
from vits_trainer.training.freerun import dtw_scores, free_running_eval, speak  # noqa: E402
from vits_trainer.training.trainstate import LoadedCheckpoint  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SAMPLE_RATE = 16000
TEST_SEED = 4321  # the test sentences' synthesis noise: not the validation's 1234
NICE = ["nice", "-n", "5"]

# Kurmanji words (Latin script) for espeak-ng's `ku` voice; sentences are random word sequences, so
# the model must read every word from its letters, as in a real fine-tune on new text
KURMANJI = (
    "silav spas ez tu ew em hûn ew baş xweş mezin biçûk nû kevn sor spî reş kesk zer şîn av nan mal "
    "zarok bav dayik bira xwişk heval bajar gund çiya roj şev sibê îro duh niha pirtûk dibistan "
    "mamoste kar dil çav dest ser dev ziman stran baran berf tav dar kulîlk hesp seg pisîk çem behr "
    "rê derî pencere xwarin çay şîr goşt sêv hinar gelek hindik û jî ne li bi ji ber bo heye tune "
    "dixwim dixwînim dinivîsim dibînim dizanim dikim diçim têm hat çû got kir xwend nivîsî dît "
    "dibêje dixwaze dikare"
).split()


# ---- corpora ------------------------------------------------------------------------------------


def write_metadata(folder: Path, rows: list[dict]) -> None:
    with open(folder / "metadata.csv", "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="|", quoting=csv.QUOTE_NONE, escapechar="\\", lineterminator="\n")
        for row in rows:
            writer.writerow([row["id"], row["text"], row["speaker"]])


def espeak_corpus(folder: Path, num_clips: int, seed: int, id_prefix: str) -> list[dict]:
    """Random Kurmanji sentences (3-7 words) spoken by espeak-ng, 16 kHz 16-bit WAVs + metadata.csv."""
    from vits_trainer.data.audio import read_audio, resample, write_wav

    if shutil.which("espeak-ng") is None:
        raise SystemExit("error: espeak-ng is not installed (apt-get install -y espeak-ng)")
    (folder / "wavs").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(num_clips):
            words = [KURMANJI[int(k)] for k in rng.integers(0, len(KURMANJI), int(rng.integers(3, 8)))]
            text = " ".join(words)
            raw = Path(tmp) / "x.wav"
            subprocess.run(["espeak-ng", "-v", "ku", "-w", str(raw), text], check=True)
            audio, rate = read_audio(raw)
            clip_id = f"{id_prefix}{i:05d}"
            write_wav(folder / "wavs" / f"{clip_id}.wav", resample(audio, rate, SAMPLE_RATE), SAMPLE_RATE)
            rows.append({"id": clip_id, "text": text, "speaker": "0"})
    write_metadata(folder, rows)
    mark_as_made(folder, "espeak")  # a corpus of ours, as make_corpus's: the runs on it keep a clip cache
    return rows


def make_corpora(
    kind: str, root: Path, seed: int, train_clips: int, test_clips: int
) -> tuple[Path, Path, str]:
    """(training data folder, disjoint test folder, the characters the model needs)."""
    data, test = root / "data", root / "test"
    if kind == "tone":
        rows = make_corpus(data, num_clips=train_clips, sample_rate=SAMPLE_RATE, seed=seed)
        test_rows = make_corpus(
            test, num_clips=test_clips, sample_rate=SAMPLE_RATE, seed=1000 + seed, id_prefix="test"
        )
    elif kind == "espeak":
        rows = espeak_corpus(data, train_clips, seed, "clip")
        test_rows = espeak_corpus(test, test_clips, 1000 + seed, "test")
    else:
        raise SystemExit(f"error: unknown corpus {kind!r} (tone, espeak)")
    seen = {r["text"] for r in rows}
    unseen = [r for r in test_rows if r["text"] not in seen]  # test sentences the run never heard
    write_metadata(test, unseen)
    chars = "".join(sorted({c for r in rows + test_rows for c in r["text"]}))
    return data, test, chars


# ---- training -----------------------------------------------------------------------------------


def train_command(
    data: Path, model: Path, run: Path, seed: int, minutes: float, save_seconds: float
) -> list[str]:
    settings = {
        **DEMO_SETTINGS,
        "data_dir": str(data),
        "model_name": str(model),
        "checkpoint_dir": str(run / "checkpoints"),
        "output_dir": str(run / "final_model"),
        "target_hours": minutes / 60,
        "save_minutes": save_seconds / 60,
        "keep_checkpoints": 10_000,  # a model for every moment the run could have evaluated
        "seed": seed,
        "best_metric": "val_mel",
    }
    args = [sys.executable, str(ROOT / "train_vits.py"), "--cpu"]
    for key, value in settings.items():
        args += [f"--{key}", str(value)]
    return NICE + args


def train(data: Path, model: Path, run: Path, seed: int, minutes: float, save_seconds: float) -> dict:
    cmd = train_command(data, model, run, seed, minutes, save_seconds)
    t0 = time.time()
    with open(run / "train.log", "w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=run)
    summary = json.loads((run / "checkpoints" / "train_summary.json").read_text())
    return {"wall_seconds": time.time() - t0, "steps": summary["steps"], "command": " ".join(cmd[3:])}


# ---- scoring ------------------------------------------------------------------------------------


class Scorer:
    """The trained run's validation split and a test set, scored for any of its checkpoints."""

    def __init__(self, data: Path, test: Path, run: Path):
        from vits_trainer.training.session import build_session

        last = list_checkpoints(run / "checkpoints")[-1]
        cfg = dataclasses.replace(
            TrainConfig(),
            data_dir=str(data),
            checkpoint_dir=str(run / "checkpoints"),
            output_dir=str(run / "scorer_out"),
            resume=str(last),  # the run's own settings and validation split
            cpu=True,
            num_workers=0,
        )
        self.s = build_session(cfg, time.time())
        self.cfg = self.s.cfg
        store, _ = load_clip_store(test, SAMPLE_RATE, log=lambda *a: None, progress=False)
        g = self.s.generator_raw
        self.test, dropped = build_items(
            store, range(len(store)), self.s.text.encode, self.s.speakers, g.hop_length
        )
        sampler = BucketBatchSampler(self.test.audio_lengths(), self.cfg.batch_size, shuffle=False)
        self.test_loader = make_loader(self.test, sampler, 0, False)

    def close(self) -> None:
        if self.s.run_lock is not None:
            self.s.run_lock.release()

    def load(self, checkpoint: Path) -> int:
        ckpt = LoadedCheckpoint(checkpoint, verify_checkpoint(checkpoint))
        self.s.model.load_state_dict(ckpt.tensors("generator.safetensors"), strict=True)
        return ckpt.step

    def score(self) -> dict:
        s, weights = self.s, self.cfg.loss_weights()
        val = evaluate(s.generator_raw, s.val_loaders["val"], s.device, weights=weights)
        freerun, _ = free_running_eval(s)  # the runner's val_mel_dtw, val_mcd, val_duration_ratio
        test_tf = evaluate(s.generator_raw, self.test_loader, s.device, weights=weights)
        spoken = speak(
            s.model, s.generator_raw.frontend, s.text, self.test, len(self.test), s.device, TEST_SEED
        )
        per = [dtw_scores(x.recorded_mel, x.spoken_mel) for x in spoken]
        return {
            "val_mel": val["val_mel"],
            **freerun,
            "test_mel": test_tf["val_mel"],
            "test_mel_dtw": float(np.mean([p["val_mel_dtw"] for p in per])),
            "test_mcd": float(np.mean([p["val_mcd"] for p in per])),
            "test_duration_ratio": float(np.mean([p["val_duration_ratio"] for p in per])),
            "test_duration_error": float(np.mean([abs(math.log(p["val_duration_ratio"])) for p in per])),
        }


TEST_MEASURES = ("test_mcd", "test_mel_dtw", "test_duration_error", "test_mel")


def spearman(a: list[float], b: list[float]) -> float | None:
    from scipy.stats import spearmanr

    if len(a) < 3:
        return None
    return float(spearmanr(a, b).statistic)


def analyse_run(rows: list[dict]) -> dict:
    """The checkpoint each criterion keeps (training steps only: the start model is never exported)."""
    trained = sorted((r for r in rows if r["step"] > 0), key=lambda r: r["step"])
    if not trained:
        return {"checkpoints": 0, "why": "no training step fitted in the budget"}
    picks = {c: min(trained, key=lambda r: r[c]) for c in ("val_mel", "val_mel_dtw")}
    out = {
        "checkpoints": len(trained),
        "pick_step": {c: r["step"] for c, r in picks.items()},
        "last_step": trained[-1]["step"],
        "disagree": picks["val_mel"]["step"] != picks["val_mel_dtw"]["step"],
        "picked": {c: {m: r[m] for m in TEST_MEASURES} for c, r in picks.items()},
        "final": {m: trained[-1][m] for m in TEST_MEASURES},
        "oracle": {m: min(r[m] for r in trained) for m in TEST_MEASURES},
        "spearman_with_test_mcd": {
            c: spearman([r[c] for r in trained], [r["test_mcd"] for r in trained])
            for c in ("val_mel", "val_mel_dtw")
        },
        "spearman_val_mel_vs_dtw": spearman(
            [r["val_mel"] for r in trained], [r["val_mel_dtw"] for r in trained]
        ),
    }
    return out


def summarise(runs: list[dict]) -> dict:
    """Medians over runs of each measure at each criterion's pick, the paired differences (dtw - mel;
    negative = val_mel_dtw kept the better model), wins, and the disagreement rate."""
    a = [r["analysis"] for r in runs if r["analysis"]["checkpoints"]]
    if not a:
        return {"runs": 0}
    out = {"runs": len(a), "disagreement_rate": sum(x["disagree"] for x in a) / len(a)}
    for m in TEST_MEASURES:
        mel = [x["picked"]["val_mel"][m] for x in a]
        dtw = [x["picked"]["val_mel_dtw"][m] for x in a]
        diffs = [d - v for d, v in zip(dtw, mel, strict=True)]
        out[m] = {
            "median_val_mel_pick": statistics.median(mel),
            "median_val_mel_dtw_pick": statistics.median(dtw),
            "median_diff_dtw_minus_mel": statistics.median(diffs),
            "dtw_pick_better": sum(d < 0 for d in diffs),
            "mel_pick_better": sum(d > 0 for d in diffs),
            "same": sum(d == 0 for d in diffs),
        }
    for c in ("val_mel", "val_mel_dtw"):
        rho = [x["spearman_with_test_mcd"][c] for x in a if x["spearman_with_test_mcd"][c] is not None]
        out[f"median_spearman_{c}_vs_test_mcd"] = statistics.median(rho) if rho else None
    return out


SCRATCH_MARK = ".bench_best_metric_scratch"


def fresh_scratch(folder: Path) -> Path:
    """An empty scratch folder; an earlier one is removed only if this bench made it (its mark file),
    so a --work pointing at the user's own folders never deletes them."""
    if folder.exists():
        if not (folder / SCRATCH_MARK).is_file():
            sys.exit(f"error: {folder} exists and was not made by this bench; choose another --work")
        shutil.rmtree(folder)  # the bench's own scratch folder from an earlier run (marked)
    folder.mkdir(parents=True)
    (folder / SCRATCH_MARK).write_text("")
    return folder


def cmd_select(args) -> None:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    results = {"command": " ".join(["python", "bench/bench_best_metric.py", *sys.argv[1:]]), "runs": []}
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    for corpus in args.corpora.split(","):
        for seed in [int(x) for x in args.seeds.split(",")]:
            root = fresh_scratch(work / f"{corpus}_{seed}")
            data, test, chars = make_corpora(corpus, root, seed, args.train_clips, args.test_clips)
            model = make_tiny_model(root / "tiny_model", characters=chars, seed=seed)
            run = root / "run"
            run.mkdir()
            load_before = os.getloadavg()[0]
            info = train(data, model, run, seed, args.minutes, args.save_seconds)
            t0 = time.time()
            scorer = Scorer(data, test, run)
            rows = []
            try:
                for path in sorted(list_checkpoints(run / "checkpoints")):  # oldest first
                    step = scorer.load(path)
                    rows.append({"step": step, **scorer.score()})
            finally:
                scorer.close()
            analysis = analyse_run(rows)
            # the runner's own final evaluation of the same weights: the bench must reproduce it
            evals = [json.loads(x) for x in (run / "checkpoints" / "metrics.jsonl").read_text().splitlines()]
            final = [e for e in evals if e.get("event") == "eval" and e.get("tag") == "final"]
            runner = {k: final[-1].get(k) for k in ("step", "val_mel", "val_mel_dtw")} if final else None
            entry = {
                "corpus": corpus,
                "seed": seed,
                "test_clips": len(scorer.test),
                "val_clips": len(scorer.s.data.val_sets["val"]),
                "load_before": load_before,
                "load_after": os.getloadavg()[0],
                "score_seconds": time.time() - t0,
                **info,
                "checkpoints": rows,
                "analysis": analysis,
                "runner_final_eval": runner,
                "runner_evals": len([e for e in evals if e.get("event") == "eval"]),
            }
            results["runs"].append(entry)
            out_path.write_text(json.dumps(results, indent=1))  # after every run: a partial result survives
            if not analysis["checkpoints"]:
                print(f"{corpus} seed {seed}: {analysis['why']}", flush=True)
                continue
            p = analysis["pick_step"]
            print(
                f"{corpus} seed {seed}: {info['steps']} steps, {analysis['checkpoints']} checkpoints; "
                f"(runner's final eval {runner}; bench at step {rows[-1]['step']}: val_mel {rows[-1]['val_mel']:.4f}, "
                f"val_mel_dtw {rows[-1]['val_mel_dtw']:.4f}); val_mel keeps step {p['val_mel']}, val_mel_dtw step {p['val_mel_dtw']} (last {analysis['last_step']}); "
                + ", ".join(
                    f"{m} {analysis['picked']['val_mel'][m]:.4f} vs {analysis['picked']['val_mel_dtw'][m]:.4f}"
                    for m in TEST_MEASURES
                ),
                flush=True,
            )
            out_path.write_text(json.dumps(results, indent=1))  # after every run: a partial result survives
            if not args.keep:
                shutil.rmtree(run / "checkpoints", ignore_errors=True)
    for corpus in {r["corpus"] for r in results["runs"]} | {"all"}:
        runs = [r for r in results["runs"] if corpus in ("all", r["corpus"])]
        results[f"summary_{corpus}"] = summarise(runs)
        print(f"summary {corpus}: {json.dumps(results[f'summary_{corpus}'], indent=1)}")
    out_path.write_text(json.dumps(results, indent=1))
    print(f"wrote {out_path}")


# ---- the promotion guard ------------------------------------------------------------------------


def clip_items(data: Path, text, hop: int, ids: list[str] | None = None):
    """TrainingItems of `data`'s clips (those in `ids`, in that order, when given)."""
    store, _ = load_clip_store(data, SAMPLE_RATE, log=lambda *a: None, progress=False)
    index = {clip_id: k for k, clip_id in enumerate(store.ids)}
    positions = [index[i] for i in ids] if ids is not None else range(len(store))
    items, _ = build_items(store, positions, text.encode, {s: 0 for s in store.speakers}, hop)
    return items


def per_clip_scores(model_dir: Path, items, seed: int) -> dict[str, dict[str, float]]:
    """{clip: {"mel": teacher-forced mel, "mel_dtw", "mcd", "duration_ratio"}} of one model, one seed:
    each clip's mel evaluated alone (as the guard does), the free-running ones spoken in order."""
    from vits_trainer.data.text import TextEncoder
    from vits_trainer.model.vits import VitsGenerator, apply_decoder_weight_norm, load_vits_model

    model = load_vits_model(model_dir)
    apply_decoder_weight_norm(model)  # as the trainer holds it (same function, VITS training layout)
    text = TextEncoder.from_pretrained(model_dir)
    generator = VitsGenerator(model)
    device = torch.device("cpu")
    mel = evaluate_per_clip(generator, items, device, seed=seed)
    spoken = speak(model, generator.frontend, text, items, len(items), device, seed)
    out = {}
    for x in spoken:
        d = dtw_scores(x.recorded_mel, x.spoken_mel)
        out[x.name] = {
            "mel": mel[x.name],
            "mel_dtw": d["val_mel_dtw"],
            "mcd": d["val_mcd"],
            "duration_ratio": d["val_duration_ratio"],
        }
    return out


def relative_changes(a: dict, b: dict, key: str) -> list[float]:
    return [b[i][key] / a[i][key] - 1.0 for i in a if i in b]


def noise_summary(a: dict, b: dict) -> dict:
    out = {}
    for key in ("mel", "mel_dtw", "mcd"):
        changes = [abs(c) for c in relative_changes(a, b, key)]
        out[key] = {
            "median_abs_rel": statistics.median(changes),
            "max_abs_rel": max(changes),
            "clips": len(changes),
        }
    return out


def judge(before: dict, after: dict) -> dict:
    """The guard's paired test on each score, and the mean relative change."""
    from vits_trainer.feedback.judgement import paired_judgement

    out = {}
    for key in ("mel", "mel_dtw", "mcd"):
        j = paired_judgement({i: v[key] for i, v in before.items()}, {i: v[key] for i, v in after.items()})
        regressed = paired_judgement(
            {i: -v[key] for i, v in before.items()}, {i: -v[key] for i, v in after.items()}
        )
        out[key] = {
            "mean_rel_change": statistics.mean(relative_changes(before, after, key)),
            "improved_beyond_noise": j["improved"],
            "regressed_beyond_noise": regressed["improved"],
            "mean_diff": j.get("mean_diff"),
            "threshold": j.get("threshold"),
        }
    return out


def cmd_guard(args) -> None:
    from vits_trainer.data.text import TextEncoder
    from vits_trainer.feedback.judgement import SEED_AFTER, SEED_BEFORE
    from vits_trainer.feedback.replay import read_split_file

    work = fresh_scratch(Path(args.work) / "guard")
    results = {"command": " ".join(["python", "bench/bench_best_metric.py", *sys.argv[1:]])}
    RESULTS.mkdir(parents=True, exist_ok=True)
    out_path = RESULTS / "best_metric_guard.json"
    # the base model: a tone-language run, as select trains them
    data, _, chars = make_corpora("tone", work, 0, args.train_clips, 4)
    model = make_tiny_model(work / "tiny_model", characters=chars, seed=0)
    run = work / "run"
    run.mkdir()
    results["base_training"] = train(data, model, run, 0, args.minutes, 60.0)
    base = run / "final_model"
    val_ids = read_split_file(base / "training_split.json")
    hop = math.prod(json.loads((base / "config.json").read_text())["upsample_rates"])
    text = TextEncoder.from_pretrained(base)
    val = clip_items(data, text, hop, val_ids)

    # 1. noise: the same weights, the guard's two seeds
    a = per_clip_scores(base, val, SEED_BEFORE)
    b = per_clip_scores(base, val, SEED_AFTER)
    results["noise_same_weights"] = noise_summary(a, b)
    results["noise_per_clip"] = {"seed_before": a, "seed_after": b}
    print(
        f"noise, same weights, seeds {SEED_BEFORE}/{SEED_AFTER}: {json.dumps(results['noise_same_weights'])}",
        flush=True,
    )
    out_path.write_text(json.dumps(results, indent=1))

    # 2. real changes: feedback rounds (new sentences of the same language) at two learning rates
    feedback = work / "feedback"
    make_corpus(feedback, num_clips=args.feedback_clips, sample_rate=SAMPLE_RATE, seed=77, id_prefix="fb")
    results["rounds"] = []
    for lr in [float(x) for x in args.feedback_lrs.split(",")]:
        out = work / f"feedback_models_lr{lr:g}"
        cmd = NICE + [
            sys.executable, str(ROOT / "train_feedback.py"), "--cpu", "--base_model", str(base),
            "--feedback_dir", str(feedback), "--data_dir", str(data), "--output_dir", str(out),
            "--target_hours", str(args.feedback_minutes / 60), "--learning_rate", str(lr),
            "--batch_size", "8", "--gradient_accumulation_steps", "1", "--warmup_steps", "5",
            "--benchmark_samples", "32", "--num_workers", "0",
        ]  # fmt: skip
        with open(work / f"feedback_lr{lr:g}.log", "w") as log:
            subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=work)
        report = json.loads((out / "v1" / "feedback_report.json").read_text())
        judged_ids = sorted(report["feedback"]["judgement"]["per_clip_before"])
        judged = clip_items(feedback, text, hop, judged_ids)
        after_model = out / "v1" / "model"
        fb_before, fb_after = (
            per_clip_scores(base, judged, SEED_BEFORE),
            per_clip_scores(after_model, judged, SEED_AFTER),
        )
        ov_after = per_clip_scores(after_model, val, SEED_AFTER)
        entry = {
            "learning_rate": lr,
            "command": " ".join(cmd[3:]),
            "promoted": report["promoted"],
            "reason": report["reason"],
            "steps": report["training"]["steps"],
            "judged_clips": len(judged_ids),
            "feedback_clips": judge(fb_before, fb_after),
            "original_validation": judge(a, ov_after),
            "per_clip": {
                "feedback_before": fb_before,
                "feedback_after": fb_after,
                "original_after": ov_after,
            },
        }
        results["rounds"].append(entry)
        print(
            f"feedback round lr {lr:g}: promoted {report['promoted']}; feedback clips "
            f"{json.dumps(entry['feedback_clips'])}; original validation {json.dumps(entry['original_validation'])}",
            flush=True,
        )
        out_path.write_text(json.dumps(results, indent=1))
    print(f"wrote {out_path}")


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="what", required=True)
    sel = sub.add_parser("select")
    sel.add_argument("--corpora", default="tone,espeak")
    sel.add_argument("--seeds", default="1,2,3")
    sel.add_argument("--minutes", type=float, default=3.0)
    sel.add_argument("--save_seconds", type=float, default=12.0)
    sel.add_argument("--train_clips", type=int, default=160)
    sel.add_argument("--test_clips", type=int, default=32)
    sel.add_argument("--work", default=str(RESULTS / "best_metric_work"))
    sel.add_argument("--out", default=str(RESULTS / "best_metric_select.json"))
    sel.add_argument("--keep", action="store_true", help="keep every run's checkpoints")
    grd = sub.add_parser("guard")
    grd.add_argument("--minutes", type=float, default=3.0, help="training of the base model")
    grd.add_argument("--train_clips", type=int, default=160)
    grd.add_argument("--feedback_clips", type=int, default=24)
    grd.add_argument("--feedback_minutes", type=float, default=1.5)
    grd.add_argument("--feedback_lrs", default="1e-5,2e-4")
    grd.add_argument("--work", default=str(RESULTS / "best_metric_work"))
    args = parser.parse_args()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    # one bench per --work: a second one would remove the first's (marked) scratch folders under it
    try:
        lock = RunLock.acquire(Path(args.work), "--work")
    except UserError as err:
        sys.exit(f"error: {err}")
    try:
        {"select": cmd_select, "guard": cmd_guard}[args.what](args)
    finally:
        if lock is not None:
            lock.release()


if __name__ == "__main__":
    main()
