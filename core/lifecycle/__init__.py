"""After training: merge, chat, evaluate, export and serve a finished run (no textual here).

Public API::

    resolve_model_source(run, checkpoint=None) -> ModelSource      # base dir, adapter dir, seed, dtype …
    load_finetuned(source, device=None) -> LoadedModel              # base + adapter (or merged/full)
    merge_run(run, checkpoint=None, out=None) -> MergeResult        # atomic safetensors dir
    stream_chat(loaded, messages, ...) -> Iterator[str]             # tokens as they are generated
    generate_reply(loaded, messages, ...) -> Reply                  # text + GenerationOutcome (ids, finish)
    stream_prompt / generate_from_prompt(loaded, ids, ...)          # the same from prompt ids (a plain text's)
    stream_pieces(loaded, ids, ..., top=k) -> Iterator[Piece]      # text with its tokens (scored: a stream's logprobs)
    context_overflow(prompt_tokens, max_tokens, limit)              # past the model's context? (server, chat)
    evaluate_run(run, checkpoint=None) -> dict                       # eval/<stamp>.json in the run dir
    export_run(run, fmt, ...) -> ExportResult
    start_server(run or None, ..., model_dir=None, api_key=None)   # detached OpenAI-compatible server
    stop_server(id) / server_state(id) / probe_request(url, …)      # id: the run's, or model_dir_id(dir)
"""

from __future__ import annotations
