from perftracker_ml.collectors.groups import GroupRegistry, group_ref


class FakeDist:
    def __init__(self, rank, groups):
        self.rank = rank
        self.groups = groups

        class C10d:
            @staticmethod
            def _get_default_group():
                return "world"
        self.distributed_c10d = C10d

    def get_rank(self):
        return self.rank

    def get_process_group_ranks(self, group):
        return self.groups[group]


class PG:
    def __init__(self, name):
        self.group_name = name


def test_group_id_is_identical_on_members_and_independent_of_rank_order():
    assert group_ref("1", [3, 1, 2]) == group_ref("1", [1, 2, 3])
    assert group_ref("1", [1, 2]).group_id != group_ref("2", [1, 2]).group_id


def test_sequence_numbers_per_group_line_up_across_members():
    sub = PG("1")
    groups = {"world": [0, 1, 2, 3], sub: [0, 2]}
    r0, r2 = GroupRegistry(FakeDist(0, groups)), GroupRegistry(FakeDist(2, groups))
    seqs0 = [r0.next_seq(r0.resolve(g)) for g in (None, sub, None, sub, None)]
    seqs2 = [r2.next_seq(r2.resolve(g)) for g in (None, sub, None, sub, None)]
    assert seqs0 == seqs2 == [0, 0, 1, 1, 2]
    assert r0.resolve(sub).ref == r2.resolve(sub).ref


def test_p2p_send_and_recv_share_a_pair_and_its_numbers():
    groups = {"world": [0, 1]}
    r0, r1 = GroupRegistry(FakeDist(0, groups)), GroupRegistry(FakeDist(1, groups))
    sends = [r0.next_seq(r0.pair(None, 1, sending=True)) for _ in range(3)]
    recvs = [r1.next_seq(r1.pair(None, 0, sending=False)) for _ in range(3)]
    assert sends == recvs == [0, 1, 2]
    assert r0.pair(None, 1, True).ref == r1.pair(None, 0, False).ref
    # the other direction is its own stream
    assert r1.next_seq(r1.pair(None, 0, sending=True)) == 0


def test_reset_after_destroy():
    reg = GroupRegistry(FakeDist(0, {"world": [0]}))
    reg.next_seq(reg.resolve(None))
    reg.reset()
    assert reg.next_seq(reg.resolve(None)) == 0
