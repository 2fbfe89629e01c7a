"""Old code: which live hosts on this machine serve an installed plugin at other code than the
installed one (another version, or another fingerprint: edited after they started), and the one
sentence ``tghost plugins`` and ``tghost call`` say of them. Offline: messages are fed to a
directory that never connects (its hosts run on the machine ``laptop``)."""

from __future__ import annotations

from tests.agent.test_skew import NEW, OLD, feed, host, offline
from tghost.agent.entries import CodeVersion, describe_old_code, old_code


def test_hosts_on_this_machine_serving_another_fingerprint_or_version_are_old_code() -> None:
    found = offline()
    feed(found, host("edited", OLD) + host("fresh", NEW) + host("upgraded", {**OLD, "version": "0.0.9"}))
    versions = old_code(found.services.values(), NEW, hostname="laptop")
    assert versions == (CodeVersion("tghost-joke", "0.1.0", "a" * 64, ("edited",)),
                        CodeVersion("tghost-joke", "0.0.9", "a" * 64, ("upgraded",)))
    assert describe_old_code("plugin 'joke'", "0.1.0", versions) == (
        "host edited serves plugin 'joke' at its old code (before your edit); host upgraded serves it at its old "
        "code (version 0.0.9; installed here: 0.1.0): restart them or run them with --reload")


def test_the_installed_code_other_machines_other_plugins_and_unknown_fingerprints_are_not_old_code() -> None:
    found = offline()
    feed(found, host("same", NEW) + host("unfingerprinted", {**OLD, "fingerprint": None})
         + host("other-plugin", {**OLD, "entry_point": "jokes"}))
    assert old_code(found.services.values(), NEW, hostname="laptop") == ()
    feed(found, host("edited", OLD))
    assert old_code(found.services.values(), NEW, hostname="elsewhere") == ()
    assert old_code(found.services.values(), {**NEW, "distribution": None}, hostname="laptop") == ()
    [version] = old_code(found.services.values(), NEW, hostname="laptop")
    assert describe_old_code("it", "0.1.0", [version]) == (
        "host edited serves it at its old code (before your edit): restart it or run it with --reload")
    assert describe_old_code("it", "0.1.0", []) == ""
