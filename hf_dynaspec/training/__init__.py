"""Training a DynaSpec drafter on CPU: self-distillation data (`data`), the losses of a batch (`losses`) and the
training loop (`trainer`).

    python -c "
    import torch; torch.set_num_threads(1)
    from hf_dynaspec import DynaSpecDrafter; from hf_dynaspec.targets import load_target
    from hf_dynaspec.training import TrainingArguments, generate_dataset, train_drafter
    t, tok = load_target('tiny'); generate_dataset(t, tok, ['hi', 'hello there'], '/tmp/ds', max_new_tokens=8, batch_size=2)
    d = DynaSpecDrafter.from_target(t, num_clusters=8)
    args = TrainingArguments(steps=10, lr=1e-3, batch_size=2, seq_len=16)
    print(train_drafter(d, t, '/tmp/ds', '/tmp/ck', args)['eval'])"
"""

from .arguments import TrainingArguments
from .data import frequent_tokens, generate_dataset, load_dataset, load_prompts
from .trainer import evaluate_drafter, train_drafter

__all__ = ["TrainingArguments", "evaluate_drafter", "frequent_tokens", "generate_dataset", "load_dataset",
           "load_prompts", "train_drafter"]
