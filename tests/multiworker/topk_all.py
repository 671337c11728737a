"""Run under horovodrun: the collective checks (gtopk_collective.py), then the exchange step
checks (topk_exchange_steps.py), in one launch."""

from tests.multiworker import gtopk_collective, topk_exchange_steps

if __name__ == "__main__":
    gtopk_collective.main()
    topk_exchange_steps.main()
