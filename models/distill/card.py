"""The student's model card (``README.md`` in its folder), written from the run's manifest."""

from __future__ import annotations


def _count(s: dict) -> str:
    if s.get("num_layers") is not None:
        return f"Its layer count was set ({s['num_layers']}), not chosen by the planner."
    return f"The wanted speed-up was {s['speedup']}x."


def _copy_kinds(d: dict) -> str:
    if d.get("prompt_set", 1) == 1:
        return ""
    return (" (questions answered by copying from their own text, some after a worked example, among them:"
            " the quality eval's generated task kinds in other words)")


def _layers(m: dict) -> str:
    search = m.get("layer_search")
    if not search:
        return "Its layers are evenly spaced, the first and the last kept."
    s = m["settings"]
    return (f"Its layers were measured: starting from all of them, each round dropped the layers whose removal alone "
            f"raised the distillation loss on {s['calibration_rows']} of the full model's answers least "
            f"(`models/distill/layers.py`), {len(search)} rounds, loss {search[-1]['loss']:.3f} before training.")


def card(m: dict, shared: list[str]) -> str:
    s, d, h, t, r = m["settings"], m["data"], m["held_out"], m["train"], m["run"]
    return f"""# Distilled fast model

Made by `fastmode distill` from **{m['full']['name']}** ({m['full']['layers']} layers): the full model
with {len(m['keep'])} of its layers kept ({', '.join(map(str, m['keep']))}), {m['parameters']:,} parameters,
trained on the full model's own greedy answers. It shares the full model's tokenizer, embedding and
head ({', '.join(shared)}), so this folder holds only its own tensors (`student.safetensors`) and is
served, or assembled (`python -m models.distill.assemble THIS_FOLDER FULL`), with that full model.
`distilled.json` has every setting and figure below.

## Shape
The planner predicts {m['shape']['predicted_tokens_per_s']:.0f} tokens/s per user for it against {m['shape']['full_predicted_tokens_per_s']:.0f} for the
full model ({m['shape']['predicted_speedup']:.2f}x) on {s['chips']} {s['device']} chip(s), every weight streamed from main memory;
{_count(s)} {_layers(m)}

## Data
{d['prompts']} generated prompts (set {d.get('prompt_set', 1)}, seed {d['prompt_seed']}: `models/distill/prompts.py`; instructions from
templates{_copy_kinds(d)}, and continuations of Python standard-library code from the training split of
`models.recipe.corpus`), each rendered with the full model's chat template and answered greedily
(at most {s['max_new_tokens']} tokens): {d['answer_tokens']:,} answer tokens, with the full model's
top {s['top_k']} log-probabilities at each. {d['held_out_prompts']} prompts held out.

## Training
{t['steps']} steps of {s['batch_size']} sequences, AdamW at {s['lr']} (warm-up {s['warmup']}, cosine to 10%),
loss {1 - s['ce_weight']:.2f} x cross-entropy to the full model's top-{s['top_k']} distribution +
{s['ce_weight']:.2f} x cross-entropy of its greedy token, on answer positions only; seed {s['seed']}.
Final training loss {t['final_loss']:.3f}.

| held out (teacher forcing) | before training | after |
|---|---|---|
| loss | {h['before']['loss']:.3f} | {h['after']['loss']:.3f} |
| top-1 agreement with the full model | {h['before']['top1_agreement']:.3f} | {h['after']['top1_agreement']:.3f} |

Top-1 agreement is the share of the full model's greedy answer tokens the student predicts given
the same history: what a greedy drafter gets accepted, token by token.

## Run
On {r['machine']} ({r['device']}, torch {r['torch']}): {t['train_s'] / 60:.1f} min of
training; the last call took {r['wall_s_this_call'] / 60:.1f} min in all ({r['answer_s_this_call'] / 60:.1f} min of it for the full model's
answers not already on disk). Wall-clock times, on a machine that may have run other work too.
Reproduce: `{r['command'].strip()}`.
"""
