"""The agent loop as a LangGraph StateGraph.

    START -> retrieve_context -> draft -> evaluate -> decide
    decide --repair--> repair -> retrieve_context
    decide --optimise--> optimise -> retrieve_context
    decide --stop--> END

`evaluate` runs the evaluator's compile -> inspect -> run in one node; the trajectory
records each stage's result as its own event. With a checkpointer (SqliteSaver at
runs/<id>/checkpoint.sqlite) every node's result is saved, so a run resumes after the
last finished node.
"""
from __future__ import annotations

from langgraph.graph import END, START, StateGraph

from agent.nodes import Nodes, route
from agent.state import AgentState


def build_graph(nodes: Nodes | None = None, checkpointer=None):
    nodes = nodes or Nodes(None)
    g = StateGraph(AgentState)
    for name in Nodes.names:
        g.add_node(name, nodes.node(name))
    g.add_edge(START, "retrieve_context")
    g.add_edge("retrieve_context", "draft")
    g.add_edge("draft", "evaluate")
    g.add_edge("evaluate", "decide")
    g.add_conditional_edges("decide", route, {"repair": "repair", "optimise": "optimise", "stop": END})
    g.add_edge("repair", "retrieve_context")
    g.add_edge("optimise", "retrieve_context")
    return g.compile(checkpointer=checkpointer)


def mermaid() -> str:
    return build_graph().get_graph().draw_mermaid()
