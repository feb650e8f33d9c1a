import time
from tests.conftest import end_record, half_record


def test_commit_rollback(checker):
    checker.write(half_record("t1"), half_record("t2"))
    checker.write(end_record("t1", "COMMIT_MESSAGE"), end_record("t2", "ROLLBACK_MESSAGE"))
    s = checker.run()
    print(s)
    assert s.commits == 1 and s.rollbacks == 1
    assert checker.table("T").count() == 1
    for i in range(3):
        checker.write(half_record(f"a{i}"), half_record(f"b{i}"))
        checker.write(end_record(f"a{i}", "COMMIT_MESSAGE"), end_record(f"b{i}", "ROLLBACK_MESSAGE"))
        s = checker.run()
        print(s)
    t = time.time(); s = checker.run(); print("empty", s, time.time() - t)
