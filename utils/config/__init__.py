"""What was asked and what it means. Importing the package registers the schemas and
resolvers every command composes its config with.

    schema     the typed keys of train, evaluate and predict (values live in conf/)
    resolvers  run names and timestamps shared by a sweep's jobs, fresh folders, the monitor
    build      build() with one-line errors; the config as flat keys and plain data
    arguments  builders' argument rules, bound to their signatures before anything is built
    monitor    which way is better for the monitored metric
    trust      what a stored config may build (each group's exact _target_s); plain bounded data
    secrets    what of a config and a command line may be written: never a credential
    familiar   Lightning's and timm's names for our keys, for a typo's suggestion
"""

# Importing the package registers the schemas in Hydra's ConfigStore and the resolvers the YAML
# files use, as every command needs both before Hydra composes its config.
from utils.config import resolvers, schema  # noqa: F401
