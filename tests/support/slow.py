"""The tests `make test-fast` leaves out: each took over about a second on its own, or its list of cases together over
about three (`--durations` on the not-`stack` set, two workers, the shared 2-core host; docs/operations.md "Test
suite"). `make test` runs them all.

Why they are slow: a process per case (production mode, settings, printed commands), a backlog built for the
query plans, a server really stopped (the `serial` ones), a sign-in throttle's password hashing, long lists of
hostile inputs. A test here is marked `slow` with all its parameters (tests/support/plugin.py applies the list);
tests/suite/test_slow_list.py fails while an entry names a test that is gone: remove the entry with the test. A new
test over a second: add it here, or mark it `@pytest.mark.slow` in its module.
"""

from __future__ import annotations

SLOW: dict[str, tuple[str, ...]] = {
    "tests/bench/test_bulk_accept.py": (
        "test_it_writes_the_same_rows_as_the_accept_function",
    ),
    "tests/callbacks/test_addresses.py": (
        "test_an_endpoint_on_127_0_0_1_is_refused_when_private_addresses_are_not_allowed",
    ),
    "tests/callbacks/test_dashboard_page.py": (
        "test_another_projects_member_gets_404",
    ),
    "tests/callbacks/test_deliver.py": (
        "test_a_delivery_arrives_signed_and_its_attempt_is_logged",
        "test_a_delivery_with_its_own_url_goes_there_signed_with_its_endpoints_secret",
        "test_a_failure_waits_for_the_next_step_of_the_schedule_and_keeps_only_1_kb_of_the_answer",
        "test_a_receiver_that_is_down_is_an_attempt_with_an_error",
        "test_a_rotated_secret_signs_the_next_attempt",
        "test_a_success_on_a_closed_circuit_leaves_the_endpoint_row_alone_and_one_after_a_failure_resets_it",
        "test_an_endpoint_deleted_while_its_delivery_was_handed_out_ends_quietly",
        "test_an_endpoint_failing_for_the_whole_period_is_disabled_and_says_so",
        "test_deliveries_to_one_receiver_share_a_kept_alive_connection_unless_an_answer_is_left_unread",
        "test_the_circuit_opens_after_a_run_of_failures_and_one_probe_closes_it",
    ),
    "tests/callbacks/test_derive.py": (
        "test_a_row_committed_late_with_a_smaller_id_is_not_skipped",
        "test_a_status_line_after_thousands_of_other_lines_is_delivered_by_one_pass",
        "test_an_inbound_message_after_thousands_of_receipts_is_delivered_by_one_pass",
        "test_each_status_change_becomes_one_delivery_per_endpoint_even_when_the_pass_runs_twice",
        "test_without_endpoints_the_cursors_move_on",
    ),
    "tests/callbacks/test_derive_plans.py": (
        "test_the_inbound_read_reads_only_upserts",
        "test_the_opt_out_read_reads_only_revocations",
        "test_the_passes_statements_are_never_prepared",
        "test_the_status_read_reads_only_status_lines_and_their_messages",
    ),
    "tests/callbacks/test_sandbox_events.py": (
        "test_a_test_sends_callback_url_goes_through_the_test_per_message_endpoint",
        "test_each_endpoint_gets_the_status_changes_of_its_own_environment",
    ),
    "tests/callbacks/test_secrets_at_rest.py": (
        "test_the_migration_encrypts_the_secrets_stored_before",
    ),
    "tests/dashboard/test_admin.py": (
        "test_a_message_page_cannot_write_the_message",
        "test_a_message_page_shows_its_timeline",
        "test_dead_letters_filter_across_projects",
        "test_messages_are_found_by_id_recipient_and_evolution_id",
        "test_reprocess_applies_unprocessed_events",
        "test_staff_with_change_permission_see_and_run_the_actions",
        "test_the_dismiss_action",
        "test_the_force_resend_action_reports_refusals",
        "test_the_force_resend_action_resends_and_records_the_operator",
        "test_the_resend_audit_lists_who_resent_what",
        "test_view_only_staff_neither_see_nor_run_the_actions",
    ),
    "tests/dashboard/test_charts.py": (
        "test_it_counts_the_last_24_hours_by_hour_and_status",
    ),
    "tests/dashboard/test_charts_browser.py": (
        "test_the_overview_draws_messages_per_hour_by_status_and_delivery_percentiles",
        "test_the_page_says_when_the_charts_are_unavailable",
    ),
    "tests/dashboard/test_environment_mode.py": (
        "test_the_webhooks_page_shows_the_modes_endpoints",
    ),
    "tests/dashboard/test_hostile_input.py": (
        "test_admin_actions_refuse_thousands_of_ids",
        "test_admin_actions_with_a_malformed_selection_answer_4xx_and_change_nothing",
        "test_admin_lists_and_pages_with_junk_parameters_never_answer_5xx",
        "test_dashboard_forms_and_views_answer_4xx_and_change_nothing",
        "test_resend_all_with_a_filter_the_form_refuses_gets_400_and_no_job",
    ),
    "tests/dashboard/test_login_behind_proxies.py": (
        "test_a_username_takes_a_bounded_number_of_guesses_from_every_address_together",
        "test_behind_a_proxy_five_wrong_passwords_lock_out_their_address_only",
        "test_one_64_is_one_address",
        "test_under_the_username_bound_another_address_signs_in",
    ),
    "tests/dashboard/test_login_throttle.py": (
        "test_a_good_sign_in_resets_the_count",
        "test_after_the_limit_even_the_right_password_is_refused_for_the_window",
        "test_malformed_usernames_are_a_form_error",
        "test_odd_headers_on_a_failed_sign_in_are_no_server_error",
        "test_one_failure_short_of_the_limit_the_right_password_still_works",
        "test_the_admin_sign_in_is_throttled_too",
        "test_the_lockout_is_per_username_and_address",
    ),
    "tests/dashboard/test_timeline_page.py": (
        "test_a_long_timeline_is_shown_a_page_at_a_time",
    ),
    "tests/dashboard/test_views.py": (
        "test_a_job_of_another_project_is_404",
        "test_a_member_of_several_projects_picks_one",
        "test_a_member_with_one_project_lands_on_its_overview",
        "test_a_refused_resend_shows_the_reason",
        "test_actions_need_post_and_a_csrf_token",
        "test_another_projects_member_gets_404_everywhere",
        "test_bulk_resend_counts_refusals_and_ignores_other_projects_ids",
        "test_bulk_resend_of_all_matching_runs_in_chunks",
        "test_bulk_resend_of_selected_entries_only",
        "test_dismiss_button",
        "test_force_resend_button_resends_as_the_member",
        "test_the_pages_show_the_projects_data",
    ),
    "tests/ingestion/test_auth_cache_bounds.py": (
        "test_junk_names_longer_than_an_instance_name_cost_no_read_and_no_memory",
        "test_the_unknown_names_cache_is_bounded_by_count_and_bytes",
    ),
    "tests/ingestion/test_consumer.py": (
        "test_a_database_outage_waits_in_the_30s_queue_without_using_a_retry",
        "test_a_failed_forward_waits_in_a_retry_queue_then_succeeds",
        "test_deliveries_arriving_during_a_confirm_wait_are_handled_after_it_never_inside",
        "test_handled_deliveries_are_acked_in_batches_and_none_is_left_unacked",
        "test_it_saves_forwards_and_acks",
        "test_with_either_ack_batch_every_delivery_is_handled_once_and_acked",
    ),
    "tests/ingestion/test_consumer_hostile.py": (
        "test_a_hostile_body_is_parked_at_once_and_stores_nothing",
    ),
    "tests/ingestion/test_inbox.py": (
        "test_concurrent_records_of_one_event_store_one_row",
    ),
    "tests/ingestion/test_inbox_indexes.py": (
        "test_the_migration_drops_only_the_like_index_and_can_be_reversed",
    ),
    "tests/ingestion/test_inbox_redaction.py": (
        "test_the_consumer_stores_no_credential",
    ),
    "tests/ingestion/test_metrics.py": (
        "test_it_lists_every_counter_as_json",
    ),
    "tests/ingestion/test_row_locks.py": (
        "test_an_accept_goes_through_while_a_dead_letter_is_being_resolved",
    ),
    "tests/ingestion/test_webhook.py": (
        "test_it_answers_503_while_the_database_is_down_so_evolution_retries",
    ),
    "tests/messaging/test_accept_fast_path.py": (
        "test_a_remembered_choice_never_outlives_the_facts_it_rests_on",
        "test_a_write_that_committed_before_its_connection_broke_is_not_written_twice",
    ),
    "tests/messaging/test_accept_path.py": (
        "test_a_pooled_connection_postgres_dropped_is_replaced_not_answered_503",
        "test_a_used_key_answers_409_before_the_payload_is_judged",
        "test_an_expired_answer_is_replaced_by_a_new_send",
        "test_no_separate_health_check_before_the_first_statement",
        "test_the_one_query_choice_equals_the_former_choice",
    ),
    "tests/messaging/test_commands.py": (
        "test_create_member",
        "test_create_member_never_touches_a_superuser",
        "test_create_member_refuses_an_existing_user_without_reset_password",
        "test_create_member_resets_a_members_password_when_asked",
    ),
    "tests/messaging/test_dead_letter_endpoints.py": (
        "test_an_unknown_entry_is_404",
        "test_resending_twice_answers_200_and_changes_nothing_more",
    ),
    "tests/messaging/test_hostile_input.py": (
        "test_a_send_body_we_do_not_take_is_400",
        "test_a_wrong_value_in_any_send_field_is_400_naming_it",
        "test_every_body_endpoint_answers_400_to_them",
        "test_junk_credentials_are_401",
        "test_junk_query_parameters_are_a_400",
        "test_refused_instance_names_are_not_remembered",
    ),
    "tests/messaging/test_idempotency_race.py": (
        "test_racing_requests_with_one_key_and_different_bodies",
        "test_racing_requests_with_one_key_create_one_message",
    ),
    "tests/messaging/test_instance_endpoint.py": (
        "test_admin_edits_the_profile_and_checks_the_overrides",
    ),
    "tests/messaging/test_lifecycle.py": (
        "test_no_module_but_the_lifecycle_writes_a_status",
    ),
    "tests/messaging/test_relay_confirms.py": (
        "test_a_broker_that_blocks_publishers_fails_the_pass_within_its_timeout",
        "test_a_kept_connection_the_broker_closed_is_replaced_within_the_pass",
        "test_a_queue_that_refuses_the_tasks_fails_the_pass",
    ),
    "tests/messaging/test_relay_plans.py": (
        "test_a_pass_over_a_backlog_postgres_cannot_see_refreshes_the_statistics",
        "test_the_release_statement_reaches_messages_by_primary_key_whatever_the_statistics",
        "test_the_turn_query_over_a_backlog_is_not_compiled_by_postgres_jit",
    ),
    "tests/messaging/test_sandbox_migration.py": (
        "test_existing_consents_and_answers_get_their_environment",
    ),
    "tests/messaging/test_send_lease.py": (
        "test_the_default_lease_grows_with_the_timeouts",
    ),
    "tests/messaging/test_send_pool_exhausted.py": (
        "test_a_claim_that_meets_a_held_row_past_the_lock_timeout_goes_back_to_its_queue",
    ),
    "tests/messaging/test_send_validation.py": (
        "test_a_refused_body_answers_the_serializers_errors",
    ),
    "tests/messaging/test_typing.py": (
        "test_typing_is_on_by_default_and_the_lease_covers_its_cap",
    ),
    "tests/messaging/test_webhook_token_salt.py": (
        "test_the_migration_salts_every_unsalted_instance_and_names_it",
    ),
    "tests/pilot_status/test_beat.py": (
        "test_the_database_scheduler_keeps_every_entrys_expiry",
    ),
    "tests/pilot_status/test_beat_lock.py": (
        "test_a_beat_started_while_postgres_is_away_ticks_only_once_it_holds_the_lock",
        "test_a_beat_that_lost_its_connection_sends_nothing_and_stops_if_another_took_the_lock",
        "test_a_beat_whose_connection_dropped_takes_the_lock_again_when_nobody_else_has",
        "test_the_lock_is_one_per_database_and_free_again_once_its_session_ends",
    ),
    "tests/pilot_status/test_compose.py": (
        "test_the_definitions_hold_on_a_real_rabbitmq",
    ),
    "tests/pilot_status/test_health.py": (
        "test_readyz_is_503_naming_redis_while_redis_is_really_stopped",
        "test_the_compose_probe_exits_0_on_a_ready_server_and_1_otherwise",
    ),
    "tests/pilot_status/test_internal_app.py": (
        "test_it_applies_a_webhook",
    ),
    "tests/pilot_status/test_lane_worker.py": (
        "test_threads_waiting_on_evolution_share_a_bounded_pool_of_connections",
    ),
    "tests/pilot_status/test_lock_closure.py": (
        "test_every_requirement_that_applies_under_each_python_is_pinned_in_the_lock",
    ),
    "tests/pilot_status/test_metrics_carry.py": (
        "test_a_process_that_exits_cleanly_sends_its_counts",
        "test_counts_refused_by_redis_are_kept_for_the_next_flush",
        "test_counts_wait_then_arrive_summed",
        "test_zero_in_a_process_starts_no_carry_thread",
    ),
    "tests/pilot_status/test_metrics_scrape.py": (
        "test_with_redis_stopped_the_scrape_still_answers_with_what_it_can_read",
    ),
    "tests/pilot_status/test_printed_commands.py": (
        "test_the_lines_make_run_prints_work_as_printed",
        "test_the_readmes_operator_commands_work_as_printed",
    ),
    "tests/pilot_status/test_production_mode.py": (
        "test_check_deploy_passes_with_the_documented_production_variables",
        "test_check_deploy_sees_the_plain_http_development_settings",
        "test_development_mode_keeps_its_defaults",
        "test_it_refuses_a_missing_short_or_weak_secret",
        "test_it_refuses_a_weak_ops_status_token",
        "test_it_refuses_any_host",
        "test_it_refuses_one_value_for_both_secrets",
        "test_private_callback_addresses_stay_off_in_production_mode_and_open_in_development_and_test_stacks",
        "test_strong_random_secrets_start",
        "test_the_internal_webhook_host_is_allowed_for_our_own_forwards",
    ),
    "tests/pilot_status/test_readyz_cache.py": (
        "test_a_flood_of_probes_costs_one_check_per_window",
    ),
    "tests/pilot_status/test_settings.py": (
        "test_a_malformed_number_stops_start_up_and_names_the_setting",
        "test_the_defaults_start",
    ),
    "tests/pilot_status/test_status_page.py": (
        "test_with_redis_stopped_the_page_still_answers_and_says_what_it_cannot_read",
    ),
}
