"""The guarantees docs/reliability.md lists beside the fault suite's own rows: each is held by a test of `make test`
(fast enough to run on every change, so it is not in tests/faults; `make test-slow` where the row says so), named here
so the page says which.
tests/unit/test_reliability_rows.py checks that every test named here exists."""

from __future__ import annotations

# (what is guaranteed, the test that fails without it)
GUARANTEES = [
    ("a kill between a re-saved checkpoint's old copy set aside and the new one renamed in resumes from the step, never an earlier one",
     "tests/unit/test_checkpoint_resave_window.py::test_stopped_between_setting_the_old_copy_aside_and_renaming_the_new_one_resumes_from_the_new"),
    ("a re-save stopped before its new copy is complete resumes from the old copy",
     "tests/unit/test_checkpoint_resave_window.py::test_stopped_before_the_new_copy_is_complete_resumes_from_the_old"),
    ("a save complete but killed before its rename counts once its checksums verify",
     "tests/unit/test_checkpoint_resave_window.py::test_a_first_save_complete_but_not_renamed_counts"),
    ("overwrite=true on a directory no export wrote is refused, nothing deleted; a staging directory not the exporter's is kept",
     "tests/unit/test_export_writer.py::test_non_empty_out_is_refused_and_left_alone"),
    ("a full disk mid-checkpoint: the earlier checkpoints intact, the partial copy removed, what happened said",
     "tests/unit/test_disk_full.py::test_a_full_disk_mid_checkpoint_keeps_the_earlier_ones_and_says_so"),
    ("a full disk mid-export: the earlier export intact, no staging left, what happened said",
     "tests/unit/test_disk_full.py::test_a_full_disk_mid_export_leaves_the_earlier_export_and_no_staging"),
    ("a full disk mid-regen shard: every row answered before kept, the torn line skipped and answered again",
     "tests/unit/test_disk_full.py::test_a_full_disk_mid_regen_shard_keeps_the_rows_before_it"),
    ("a torn train.jsonl recorded complete is found on the next regen and written again from the answered parts",
     "tests/unit/test_regen_app.py::test_a_tiny_run_writes_disjoint_splits_resumes_and_skips_what_is_complete"),
    ("a torn gate verdict is never cached, and one damaged after it was is run again",
     "tests/unit/test_pipeline_gate_first.py::test_a_torn_verdict_is_never_cached_and_is_found_on_the_next_run"),
    ("a torn feature-store index is named with the fix on the next open",
     "tests/unit/test_store_integrity.py::test_a_torn_index_is_named_with_the_fix_on_the_next_open"),
    ("a crafted DCP .metadata is refused before it is unpickled (no code runs)",
     "tests/unit/test_sharded_checkpoint.py::test_a_crafted_metadata_is_refused_before_dcp_unpickles_it"),
    ("an index naming weight files outside the draft's directory is refused",
     "tests/unit/test_importer_shard_names.py::test_an_index_naming_a_file_outside_the_draft_is_refused"),
    ("a pipeline SIGKILLed mid-stage leaves nothing of the stage running (its workers included)",
     "tests/unit/test_pipeline_stage_dies_with_it.py::test_a_pipeline_killed_mid_stage_leaves_nothing_of_the_stage_running"),
    ("two pipelines started on one out: one runs, one is refused naming the holder; killed, the rerun takes over",
     "tests/integration/test_out_locks.py::test_two_pipelines_on_one_out_one_runs_then_killed_leaves_no_stage_running"),
    ("two regens on one out: one runs, one is refused", "tests/integration/test_out_locks.py::test_two_regens_on_one_out_one_runs_and_one_is_refused"),
    ("two exports to one out: one runs, one is refused", "tests/integration/test_out_locks.py::test_two_exports_to_one_out_one_runs_and_one_is_refused"),
    ("a stale lock taken over by racing processes: exactly one wins", "tests/unit/test_out_lock.py::test_processes_racing_for_a_stale_lock_exactly_one_takes_it"),
    ("an endpoint's API key never follows a redirect to another host, port or scheme",
     "tests/unit/test_http_rules.py::test_a_redirect_to_another_port_never_carries_the_key"),
    ("an API key for plain http:// off this machine is refused before anything is sent",
     "tests/unit/test_http_rules.py::test_a_key_for_plain_http_on_another_machine_is_refused_before_anything_is_sent"),
    ("a server that drips its answer is cut at the request's total timeout",
     "tests/unit/test_http_rules.py::test_a_server_that_drips_is_cut_at_the_total_timeout"),
    ("a keyed regen run writes and prints the key nowhere",
     "tests/integration/test_own_servers_http.py::test_a_keyed_endpoint_run_writes_the_key_nowhere"),
    ("the project's own vLLM servers answer its clients with VLLM_API_KEY and http_proxy set (make test-slow; a fake "
     "server's test of the same in make test)",
     "tests/integration/test_own_servers_http.py::test_real_vllm_started_here_answers_every_own_client_despite_vllm_api_key_and_a_proxy"),
    ("a capture by shard over ranks with unequal shares never leaves a rank in an all-gather alone, and equals one process's",
     "tests/integration/test_capture_by_shard.py::test_two_ranks_holding_the_target_by_shard_capture_what_one_process_does"),
    ("a capture through vLLM killed mid-way leaves no server running and resumes with nothing lost or doubled (make test-slow)",
     "tests/integration/test_capture_vllm_store.py::test_a_capture_through_vllm_killed_mid_way_leaves_no_server_and_resumes"),
]
