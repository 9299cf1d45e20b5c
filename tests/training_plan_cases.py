"""One client's local training on the tiny recipe under a few settings, and what main's code path trained there
before local training took a ``TrainingPlan`` instead of the whole recipe (issue 40): shared by
``test_training_plan.py``.

``RECORDED`` was written by main's ``train_client(..., recipe, ...)`` / ``train_reference(..., recipe, ...)`` (commit
4cfd23f) on torch ``RECORDED_ON``: each case's update as a SHA-256 of its bytes and per-tensor sums, with the
probe losses. Another CPU's kernels may round otherwise, so the digest is compared where the torch build and
its CPU capability are those; the sums and losses everywhere, to float tolerance.
"""

from __future__ import annotations

import hashlib

import torch
from helpers import TINY

from kfca_llm.data import load_client_datasets
from kfca_llm.fl.seeds import train_seed
from kfca_llm.modeling import load_model_and_tokenizer
from kfca_llm.recipe import load_recipe

ROUND_CASES = {
    # name: (recipe overrides, client, rows of the client (None: all), round, the server's reference training)
    "tiny": ((), 0, None, 3, False),  # the shipped recipe: 8 steps of 4, constant, adamw, clipping at 1
    "schedule": (("train.training-arguments.optim=sgd", "train.training-arguments.lr-scheduler-type=cosine",
                  "train.training-arguments.warmup-ratio=0.3", "train.training-arguments.gradient-accumulation-steps=2",
                  "train.training-arguments.per-device-train-batch-size=2", "train.training-arguments.max-grad-norm=0.5",
                  "train.training-arguments.max-steps=0", "train.training-arguments.num-train-epochs=2"),
                 1, 10, 7, False),  # epochs bound the steps: ceil(10 / 4) * 2 = 6
    "reference": (("train.training-arguments.lr-scheduler-type=linear", "train.training-arguments.warmup-steps=2",
                   "train.training-arguments.max-steps=4", "train.dynamic-data-seed=false"), 2, 12, 2, True),
}


def case_inputs(name: str):
    """(recipe, model, pad token id, examples, global adapter, round, the client's seed, reference?) of a case."""
    from kfca_llm.fl.client import adapter_state

    overrides, client, rows, server_round, reference = ROUND_CASES[name]
    recipe = load_recipe(TINY, list(overrides))
    model, tok = load_model_and_tokenizer(recipe)
    examples = load_client_datasets(recipe, tok)[client][:rows]
    noise = torch.Generator().manual_seed(11)
    global_state = {k: v + 0.01 * torch.randn(v.shape, generator=noise) for k, v in adapter_state(model).items()}
    seed = train_seed(recipe.kfca.seed, server_round, client, recipe.train.dynamic_data_seed)
    return recipe, model, tok.pad_token_id, examples, global_state, server_round, seed, reference


def machine() -> str:
    return f"{torch.__version__} {torch.backends.cpu.get_cpu_capability()}"


def summary(update, loss_before: float | None = None, loss_after: float | None = None) -> dict:
    digest = hashlib.sha256()
    for name in sorted(update):
        digest.update(name.encode())
        digest.update(update[name].contiguous().numpy().tobytes())
    return {"sha256": digest.hexdigest(), "sums": {k: float(update[k].double().sum()) for k in sorted(update)},
            "loss_before": loss_before, "loss_after": loss_after}


RECORDED_ON = '2.13.0+cpu AVX2'
RECORDED: dict[str, dict] = {'tiny': {'sha256': 'f427a01f4587f94a1249a1211a9df8f94a6f3ac0e63fa287d09e3e4ecf262d22',
          'sums': {'base_model.model.model.layers.0.mlp.down_proj.lora_A.weight': 0.06217104836832732,
                   'base_model.model.model.layers.0.mlp.down_proj.lora_B.weight': -0.0516441578802187,
                   'base_model.model.model.layers.0.mlp.gate_proj.lora_A.weight': -0.2146447943232488,
                   'base_model.model.model.layers.0.mlp.gate_proj.lora_B.weight': -0.4402101627201773,
                   'base_model.model.model.layers.0.mlp.up_proj.lora_A.weight': -0.2970064516412094,
                   'base_model.model.model.layers.0.mlp.up_proj.lora_B.weight': -0.3504513290099567,
                   'base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight': -0.43186620820779353,
                   'base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight': -0.00919172610156238,
                   'base_model.model.model.layers.0.self_attn.o_proj.lora_A.weight': 0.28761240997118875,
                   'base_model.model.model.layers.0.self_attn.o_proj.lora_B.weight': 0.03847064892761409,
                   'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight': 0.22618276573484764,
                   'base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight': -0.04106098145712167,
                   'base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight': 0.47882316168397665,
                   'base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight': -0.5155391833395697,
                   'base_model.model.model.layers.1.mlp.down_proj.lora_A.weight': 0.5412748262751848,
                   'base_model.model.model.layers.1.mlp.down_proj.lora_B.weight': 0.2341150385036599,
                   'base_model.model.model.layers.1.mlp.gate_proj.lora_A.weight': -0.10635218489915133,
                   'base_model.model.model.layers.1.mlp.gate_proj.lora_B.weight': 0.5473431092104875,
                   'base_model.model.model.layers.1.mlp.up_proj.lora_A.weight': 0.03266643069218844,
                   'base_model.model.model.layers.1.mlp.up_proj.lora_B.weight': 0.8923448943096446,
                   'base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight': -0.6466592255746946,
                   'base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight': 0.021590341348201036,
                   'base_model.model.model.layers.1.self_attn.o_proj.lora_A.weight': -0.09283612750004977,
                   'base_model.model.model.layers.1.self_attn.o_proj.lora_B.weight': -0.004391493072034791,
                   'base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight': 0.11681965191382915,
                   'base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight': -0.6419435737770982,
                   'base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight': 0.10172106022946537,
                   'base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight': -0.03526953185792081},
          'loss_before': 5.545365333557129,
          'loss_after': 5.095370769500732},
 'schedule': {'sha256': '91af0f9638c366f2aea2aeafaa65e45147c72aac74e4b32c2c3a00e8b1240ad3',
              'sums': {'base_model.model.model.layers.0.mlp.down_proj.lora_A.weight': 2.4092380044749007e-05,
                       'base_model.model.model.layers.0.mlp.down_proj.lora_B.weight': 1.0190083230554592e-06,
                       'base_model.model.model.layers.0.mlp.gate_proj.lora_A.weight': 9.495600352238398e-06,
                       'base_model.model.model.layers.0.mlp.gate_proj.lora_B.weight': -1.1078697070843191e-05,
                       'base_model.model.model.layers.0.mlp.up_proj.lora_A.weight': -2.930766459030565e-05,
                       'base_model.model.model.layers.0.mlp.up_proj.lora_B.weight': -0.0003545492336343159,
                       'base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight': -1.6507819964317605e-06,
                       'base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight': -7.165054739743937e-06,
                       'base_model.model.model.layers.0.self_attn.o_proj.lora_A.weight': 0.00010762560850707814,
                       'base_model.model.model.layers.0.self_attn.o_proj.lora_B.weight': -0.00026587122465571156,
                       'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight': -1.209169568028301e-06,
                       'base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight': 4.791780838786508e-06,
                       'base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight': 6.902255245222477e-05,
                       'base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight': -0.0017510101738480444,
                       'base_model.model.model.layers.1.mlp.down_proj.lora_A.weight': -1.5355022696894594e-05,
                       'base_model.model.model.layers.1.mlp.down_proj.lora_B.weight': 6.792488056817092e-05,
                       'base_model.model.model.layers.1.mlp.gate_proj.lora_A.weight': 1.1969255865551531e-05,
                       'base_model.model.model.layers.1.mlp.gate_proj.lora_B.weight': -9.440043231734307e-05,
                       'base_model.model.model.layers.1.mlp.up_proj.lora_A.weight': 1.6346231859643012e-05,
                       'base_model.model.model.layers.1.mlp.up_proj.lora_B.weight': -5.104837850922195e-05,
                       'base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight': 1.250737113878131e-07,
                       'base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight': 2.1652085706591606e-06,
                       'base_model.model.model.layers.1.self_attn.o_proj.lora_A.weight': -7.807423389749601e-05,
                       'base_model.model.model.layers.1.self_attn.o_proj.lora_B.weight': -8.852791870594956e-05,
                       'base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight': -1.313892425969243e-07,
                       'base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight': -2.1757477952633053e-06,
                       'base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight': -1.2246004189364612e-05,
                       'base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight': 0.00010065890091937035},
              'loss_before': 5.506415367126465,
              'loss_after': 5.504741668701172},
 'reference': {'sha256': '5e0ceb6e355b1dfcbb556f57bff1ad2abe4270acc35685e8a00530abc1a49086',
               'sums': {'base_model.model.model.layers.0.mlp.down_proj.lora_A.weight': -0.05011261414620094,
                        'base_model.model.model.layers.0.mlp.down_proj.lora_B.weight': -0.014499549666652456,
                        'base_model.model.model.layers.0.mlp.gate_proj.lora_A.weight': 0.09514585824217647,
                        'base_model.model.model.layers.0.mlp.gate_proj.lora_B.weight': -0.1265297011414077,
                        'base_model.model.model.layers.0.mlp.up_proj.lora_A.weight': -0.19651743076974526,
                        'base_model.model.model.layers.0.mlp.up_proj.lora_B.weight': -0.27256252596271224,
                        'base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight': -0.1208934421883896,
                        'base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight': -0.08835994226683397,
                        'base_model.model.model.layers.0.self_attn.o_proj.lora_A.weight': 0.13778404251206666,
                        'base_model.model.model.layers.0.self_attn.o_proj.lora_B.weight': -0.08560154752922244,
                        'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight': -0.07493346245610155,
                        'base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight': 0.12810715417435858,
                        'base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight': 0.08806761377491057,
                        'base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight': -0.27832858747569844,
                        'base_model.model.model.layers.1.mlp.down_proj.lora_A.weight': 0.10249281243886799,
                        'base_model.model.model.layers.1.mlp.down_proj.lora_B.weight': -0.048571669933153316,
                        'base_model.model.model.layers.1.mlp.gate_proj.lora_A.weight': 0.08320381329394877,
                        'base_model.model.model.layers.1.mlp.gate_proj.lora_B.weight': 0.19753922027302906,
                        'base_model.model.model.layers.1.mlp.up_proj.lora_A.weight': 0.03762389672920108,
                        'base_model.model.model.layers.1.mlp.up_proj.lora_B.weight': -0.032505179715371924,
                        'base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight': -0.06746286794077605,
                        'base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight': 0.05727224925067276,
                        'base_model.model.model.layers.1.self_attn.o_proj.lora_A.weight': -0.01896528317593038,
                        'base_model.model.model.layers.1.self_attn.o_proj.lora_B.weight': -0.06610183144221082,
                        'base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight': 0.08049746335018426,
                        'base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight': -0.1441349234082736,
                        'base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight': -0.06536646821768954,
                        'base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight': 0.0050595495267771184},
               'loss_before': None,
               'loss_after': None}}
