"""prepare_data.py's reader for Hugging Face `datasets` sources: a `save_to_disk` folder, a folder of
data files (parquet/arrow) or one such file, or a hub id. Apart from corpus.py because it is the one
reader that needs `datasets` and the hub (offline, only the local cache is tried). Audio stays encoded
bytes: decoding is prepare_convert.py's, with soundfile.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from ..hub import download_hint, go_offline_if_unreachable
from .corpus_rows import (
    AUDIO_COLUMNS,
    TEXT_COLUMNS,
    Candidate,
    Problem,
    Row,
    Source,
    pick_column,
    resolve_in,
    speaker_column_of,
)


def read_hf(
    source: str,
    split: str | None,
    audio_column: str | None = None,
    text_column: str | None = None,
    speaker_column: str | None = None,
    id_column: str | None = None,
) -> Source:
    ds, split_name, folder = _load_dataset(source, split)
    columns = list(ds.column_names)
    # as for tables: the first of audio, path, file_name, ... (a dataset of paths often names them `path`)
    audio_column = pick_column(Path(source), columns, audio_column, AUDIO_COLUMNS, "--audio_column")
    text_column = pick_column(Path(source), columns, text_column, TEXT_COLUMNS, "--text_column")
    for name, flag in ((speaker_column, "--speaker_column"), (id_column, "--id_column")):
        if name is not None and name not in columns:
            raise UserError(
                f"--source {source}: {flag} {name} is not a column (columns: {', '.join(columns)})"
            )
    speaker_column, speaker_notes = speaker_column_of(columns, speaker_column)

    from datasets import Audio, Value

    feature = ds.features[audio_column]
    is_path_column = isinstance(feature, Value) and feature.dtype in ("string", "large_string")
    if not is_path_column and not isinstance(feature, Audio) and not _audio_storage(feature):
        raise UserError(f"--source {source}: column {audio_column!r} holds {feature}, not audio or paths")
    if not is_path_column:
        # Keep the encoded file bytes: decoding is ours (soundfile), so no torchcodec/ffmpeg is needed.
        ds = ds.cast_column(audio_column, Audio(decode=False))

    wanted = [c for c in dict.fromkeys([audio_column, text_column, speaker_column, id_column]) if c]
    table = ds.select_columns(wanted).with_format("arrow")
    paths: list[str | None] = []
    has_bytes: list[bool] = []
    texts, speakers, ids = [], [], []
    for start in range(0, len(ds), 1000):
        batch = table[start : start + 1000]
        audio = batch.column(audio_column).combine_chunks()
        if is_path_column:
            paths += audio.to_pylist()
            has_bytes += [False] * len(audio)
        else:
            paths += audio.field("path").to_pylist()
            has_bytes += audio.field("bytes").is_valid().to_pylist()
        texts += batch.column(text_column).to_pylist()
        speakers += batch.column(speaker_column).to_pylist() if speaker_column else [None] * len(audio)
        ids += batch.column(id_column).to_pylist() if id_column else [None] * len(audio)

    stems = [Path(p).stem if p else "" for p in paths]
    use_stems = all(stems) and len(set(stems)) == len(stems)
    width = max(6, len(str(len(ds))))
    rows: list[Row] = []
    for i, (path, blob) in enumerate(zip(paths, has_bytes, strict=True)):
        origin = f"{split_name}[{i}]"
        if id_column:
            clip_id = "" if ids[i] is None else str(ids[i])
        else:
            clip_id = stems[i] if use_stems else f"{split_name}_{i:0{width}d}"
        text = "" if texts[i] is None else str(texts[i])
        speaker = "0" if speakers[i] is None or str(speakers[i]).strip() == "" else str(speakers[i])
        if blob:
            rows.append(Candidate(clip_id, text, speaker, origin, audio_key=i))
        elif path:
            resolved = resolve_in(folder, path) if folder is not None else Path(path)
            rows.append(Candidate(clip_id, text, speaker, origin, audio_path=resolved))
        else:
            rows.append(Problem(origin, "missing_audio", "no audio bytes or path", clip_id))

    fetch_table = ds.select_columns([audio_column])

    def fetch_audio(keys: list[int]) -> list[bytes | None]:
        return [item["bytes"] for item in fetch_table[keys][audio_column]]

    location = source if folder is None or Path(source).is_file() else str(folder)
    notes = [f"split {split_name}: {len(ds)} rows; text from {text_column!r}"]
    notes += speaker_notes
    return Source("hf", location, rows, folder=folder, fetch_audio=fetch_audio, notes=notes)


def _audio_storage(feature) -> bool:
    """Audio as the datasets Audio type stores it, without that type: {bytes, path} records (or either
    alone) or bare bytes, as a parquet file written by pandas or pyarrow holds them (a dataset's
    to_pandas().to_parquet()); they were refused as not audio. Cast to Audio, they are read as it is."""
    from datasets import Value

    kinds = {"bytes": ("binary", "large_binary"), "path": ("string", "large_string")}
    if isinstance(feature, Value):
        return feature.dtype in kinds["bytes"]
    if not isinstance(feature, dict) or not feature or not set(feature) <= set(kinds):
        return False
    return all(isinstance(v, Value) and v.dtype in kinds[k] for k, v in feature.items())


def _load_dataset(source: str, split: str | None):
    """Return (Dataset, split name, local folder or None) without decoding any audio."""
    path = Path(source).expanduser()
    # before `datasets` is imported (it reads the offline switch once): offline, only its local cache
    # is tried, with no ~25 s of network retries
    offline = None if path.exists() else go_offline_if_unreachable()
    try:
        import datasets
    except ImportError:
        raise UserError("--format hf needs the `datasets` package (pip install datasets)") from None
    if not path.exists():
        try:
            return datasets.load_dataset(source, split=split or "train"), split or "train", None
        except Exception as err:
            why = f"not in the local cache; {offline}" if offline else _one_line(err)
            raise UserError(
                f"--source {source}: no such file or folder, and no Hugging Face hub dataset of that name "
                f"could be loaded ({why}); for a hub dataset, download it where there is network "
                f"({download_hint(source, 'dataset')}) and pass that folder"
            ) from None
    try:
        if path.is_file():  # one data file: its builder by suffix; paths in it are relative to its folder
            builder = path.suffix.lower().lstrip(".")
            if builder not in ("parquet", "arrow"):
                raise UserError(f"--source {source}: --format hf takes a folder or a .parquet/.arrow file")
            loaded, path = datasets.load_dataset(builder, data_files=str(path)), path.parent
        elif (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
            loaded = datasets.load_from_disk(str(path))
        else:
            loaded = datasets.load_dataset(str(path))
    except Exception as err:
        raise UserError(f"--source {source}: datasets could not load it ({_one_line(err)})") from None
    if isinstance(loaded, datasets.Dataset):
        if split is not None and split != "train":
            raise UserError(f"--source {source}: a single dataset (no splits); drop --split {split}")
        return loaded, "train", path
    names = list(loaded.keys())
    if split is None:
        split = "train" if "train" in names else (names[0] if len(names) == 1 else None)
    if split not in names:
        raise UserError(f"--source {source}: pass --split (one of: {', '.join(names)})")
    return loaded[split], split, path


def _one_line(err: BaseException) -> str:
    return (" ".join(str(err).split()) or type(err).__name__)[:300]
