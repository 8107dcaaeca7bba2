"""Messages → prompt ids: chat templates, rendering, splicing onto recorded ids, tokenization.

:mod:`~agentrl.prompts.templates` renders a tokenizer's chat template as transformers does;
:mod:`~agentrl.prompts.rendering` turns a conversation into ids (identical to
``apply_chat_template``); :mod:`~agentrl.prompts.splice` feeds the engine a chain's recorded
ids plus the rendering of only the new messages; :mod:`~agentrl.prompts.segments` and
:mod:`~agentrl.prompts.seams` tokenize text pieces and find where templates join them;
:mod:`~agentrl.prompts.keys` and :mod:`~agentrl.prompts.sampled` say how a replayed message
compares with, and is restored to, what was sampled. Nothing here serves HTTP.
"""
