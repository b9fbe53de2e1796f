"""Server side of the vLLM CPU reload fix: a vLLM worker extension that reloads the weights and then redoes the CPU MoE
pre-pack that vLLM 0.32 skips on a reload. It runs inside vLLM's worker process, never in the trainer's: vLLM is no
dependency of r3 (its modules are imported inside the method).

    PYTHONPATH=/path/to/r3-checkout VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server ... \\
        --worker-extension-cls r3.rollout.vllm_cpu_reload.CpuReload
    python train.py ... --engine vllm:URL --vllm-reload-method reload_weights_repacked

The bug (docs/servers.md, "The CPU reload bug"): `UnquantizedFusedMoEMethod.process_weights_after_loading` runs the
CPU kernel's `process_weights_after_loading` (which re-lays each expert matrix out in 16-row blocks for its grouped
GEMM) only at the first load; a `reload_weights` copies checkpoint-layout weights into storage the kernel reads as
packed, every call answers 200, and the log-probs are off (1e-2 mean on a flat random toy, 0.5 on a trained one).
The fix below calls vLLM's own `cpu_prepack_moe_weight` on every CPU MoE layer after the reload, in place (the
compiled graph keeps its storages), so it follows vLLM's layout for its ISA and dtype rather than copying it (tested:
fp32 and bf16, results/servers/vllm_cpu.md). Method name, arguments and answer: `reload_weights_repacked(
weights_path=None)` -> the number of MoE layers re-packed (a string over HTTP).
Refused: a layer whose intermediate size vLLM padded at load (not a multiple of the ISA's block; the toy's 64 is not).
Left out: the zentorch path (no pre-pack there), GPU workers (no bug there seen; use plain `reload_weights`).
"""
import torch


class CpuReload:
    """Mixed into vLLM's worker class by `--worker-extension-cls`: `self` is the worker."""

    def reload_weights_repacked(self, weights_path: str | None = None) -> int:
        from vllm._custom_ops import cpu_prepack_moe_weight
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

        self.reload_weights(weights_path=weights_path)  # vLLM's layer-wise in-place reload
        n = 0
        with torch.no_grad():
            for m in self.get_model().modules():
                kernel = getattr(getattr(m, "quant_method", None), "moe_kernel", None)
                fe = getattr(kernel, "fused_experts", None)
                if not isinstance(fe, CPUUnquantizedExperts) or fe._use_zentorch:
                    continue
                if fe._padded_intermediate_size(fe.moe_config) != fe.moe_config.intermediate_size_per_partition:
                    raise RuntimeError("a padded MoE intermediate size: the reload cannot be re-packed in place")
                m.w13_weight.data.copy_(cpu_prepack_moe_weight(m.w13_weight.data, fe.isa))
                m.w2_weight.data.copy_(cpu_prepack_moe_weight(m.w2_weight.data, fe.isa))
                n += 1
        return n
