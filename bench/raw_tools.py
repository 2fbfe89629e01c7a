"""The yardstick for ``tghost tools`` and ``tghost call`` start-up: a raw Python script
that imports pulsar-client, reads the current announcement epochs (docs/protocol.md §4.1) to
their end and prints the live tool names. No tghost, no validation, no signatures.

``python bench/raw_tools.py PULSAR_URL DESCRIPTORS_TOPIC``
"""

import json
import sys
import time

import pulsar

EPOCH_SECONDS = 300  # docs/protocol.md §4.1


def main(url: str, base: str) -> None:
    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    now, tools = time.time(), {}
    for epoch in range(int((now - 90) // EPOCH_SECONDS), int((now + 60) // EPOCH_SECONDS) + 1):
        reader = client.create_reader(f"{base}-epoch-{epoch}", pulsar.MessageId.earliest)
        try:
            while reader.has_message_available():
                value = json.loads(reader.read_next(5000).data())
                if value.get("kind") == "tool":
                    tools[value["name"]] = value["status"]
        except pulsar.PulsarException:
            pass  # pulsar-lite 0.2.0 answers an empty topic's last-message-id with an error
        reader.close()
    print("\n".join(sorted(name for name, status in tools.items() if status == "available")))
    client.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
