"""Framework adapters (optional extras: ``langchain-core``, ``llama-index-core``).

* ``prefixcache.integrations.adapters.langchain_chat.PrefixCacheChatModel``: a LangChain
  ``BaseChatModel`` on any SDK client, streaming, usage with ``cache_read`` tokens.
* ``prefixcache.integrations.adapters.llamaindex_llm.PrefixCacheLLM``: a LlamaIndex LLM.

No code change is needed either: point the frameworks' OpenAI classes at the server,
``ChatOpenAI(base_url="http://127.0.0.1:8000/v1", api_key="KEY", model="smollm2")`` or
``OpenAILike(api_base="http://127.0.0.1:8000/v1", api_key="KEY", model="smollm2",
is_chat_model=True)``. The modules are imported on demand so this package never requires
either framework.
"""
