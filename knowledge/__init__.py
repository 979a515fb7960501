"""Architecture knowledge: markdown docs (knowledge/docs/<arch>/), helper headers
(knowledge/include/ptxbench/*.cuh, on every compile's include path) and the retriever that
picks doc sections for a model's context. Imports nothing of agent/, tools/ or tasks/."""
from knowledge.retriever import MODES, Retrieval, SectionRef, retrieve

__all__ = ["MODES", "Retrieval", "SectionRef", "retrieve"]
