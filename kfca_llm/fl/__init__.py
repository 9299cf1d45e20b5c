"""The federated layer, one step of the data flow per module.

``training_plan`` (the recipe resolved once into what local training reads), ``client`` (one client, one round:
local training -> update), ``scoring`` (a round's submissions -> rewards), ``aggregate`` (FedAvg), ``rounds`` (the
driver: sample, train, submit, score, aggregate, save), ``distributed`` (accelerate processes), ``state`` (adapters,
client updates, resume state on disk), ``records`` (what a run reports), ``seeds`` (derived seeds).
"""
