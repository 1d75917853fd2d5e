"""Broker adapters: one module per broker, SDKs imported lazily."""

from relay.brokers.base import BrokerFeatures, Publisher

__all__ = ["BrokerFeatures", "Publisher"]
