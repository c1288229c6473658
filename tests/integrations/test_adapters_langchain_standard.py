"""LangChain's own standard unit tests (``langchain-tests``) for the adapter: construction,
standard and LangSmith params (a per-call model included), ``bind_tools`` with every tool
form, ``with_structured_output`` with every schema form, serialization. The integration half
of the suite asks a capable model for jokes and arithmetic; its figures against SmolLM2 are in
the documentation, not here."""

from __future__ import annotations

from langchain_tests.unit_tests import ChatModelUnitTests

from prefixcache.integrations.adapters.langchain_chat import PrefixCacheChatModel


class TestPrefixCacheChatModelStandard(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[PrefixCacheChatModel]:
        return PrefixCacheChatModel

    @property
    def chat_model_params(self) -> dict:
        return {"base_url": "http://127.0.0.1:9", "model": "smollm2", "temperature": 0}

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def init_from_env_params(self) -> tuple[dict, dict, dict]:
        env = {"PREFIXCACHE_BASE_URL": "http://127.0.0.1:9", "PREFIXCACHE_API_KEY": "k"}
        return env, {"model": "smollm2"}, {"base_url": "http://127.0.0.1:9", "api_key": "k"}
