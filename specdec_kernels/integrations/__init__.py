"""Other engines using specdec-kernels' ops: thin adapters over `specdec_kernels.ops`.

Each integration imports its engine lazily and changes nothing unless the user turns it on;
`import specdec_kernels` never imports an engine.

    integrations.vllm        vLLM plugin (entry point `vllm.general_plugins: specdec_kernels`),
                             active with SPECDEC_KERNELS_VLLM=1: vLLM V1's rejection sampling runs on our ops.
    integrations.flashinfer  FlashInfer's chain_speculative_sampling (and its uniform-samples form) on
                             ops.rejection_sample; imports no FlashInfer.
    integrations.sglang      SGLang's tree kernels (verify_tree_greedy, tree_speculative_sampling_target_only)
                             with sgl_kernel's in-place argument layout, on ops.tree_greedy_verify /
                             tree_rejection_sample; imports no SGLang.
"""
