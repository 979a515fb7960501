"""Architecture knowledge: markdown docs (knowledge/docs/<arch>/), helper headers
(knowledge/include/ptxbench/*.cuh, on every compile's include path), worked examples kept out
of the nested arms (knowledge/examples/) and the retriever that picks doc sections for a
model's context. Imports nothing of agent/, tools/ or tasks/."""
from knowledge.retriever import MODES, NESTED_MODES, Retrieval, SectionRef, retrieve, task_query

__all__ = ["MODES", "NESTED_MODES", "Retrieval", "SectionRef", "retrieve", "task_query"]
