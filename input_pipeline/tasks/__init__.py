"""Fine-tuning tasks: GLUE (`glue.GlueTask`), SQuAD (`squad.SquadTask`), CoNLL-2003 NER
(`ner.NerTask`), sentence sentiment (`sentiment.SentimentTask`, the demo's movie reviews), all
implementing `base.Task`. `make_task(config.task)` builds one from a config's ``task`` section
(``family`` = glue | squad | ner | sentiment; see configs/glue.py, squad.py, ner.py, sentiment.py)."""

from __future__ import annotations

FAMILIES = ("glue", "squad", "ner", "sentiment")


def make_task(task_config):
    """The task a config's ``task`` section describes. ``source``: a local directory (or file
    paths) in the official format, or ``tfds`` / ``tfds:NAME`` (then ``data_dir`` is TFDS's)."""
    t = dict(task_config)
    family = t.pop("family", None)
    source, data_dir = t.pop("source", ""), t.pop("data_dir", "") or None
    if family == "glue":
        from input_pipeline.tasks.glue import GlueTask

        return GlueTask(t.pop("name"), source, data_dir=data_dir, **t)
    if family == "squad":
        from input_pipeline.tasks.squad import SquadTask

        return SquadTask(t.pop("version"), source, data_dir=data_dir, **t)
    if family == "ner":
        from input_pipeline.tasks.ner import NerTask

        labels = t.pop("label_names", "")
        if isinstance(labels, str):
            labels = tuple(x for x in labels.split(",") if x) or None
        return NerTask(source, data_dir=data_dir, label_names=labels, **t)
    if family == "sentiment":
        from input_pipeline.tasks.sentiment import SentimentTask

        return SentimentTask(source, **t)
    raise ValueError(f"config.task.family={family!r}: expected one of {FAMILIES}")
