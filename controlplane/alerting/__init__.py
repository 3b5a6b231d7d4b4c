"""Alert evaluation over the history, alert state and timeline, silences, receivers and the outbox.

`service` holds what people do (acknowledge, silence, manage receivers), `readmodel` how alerts,
silences and receivers are shown; `api` and the console pages only parse, call and render.
"""
