"""Words that carry no subject, Russian and English: question words, pronouns, prepositions,
auxiliaries, politeness, the assistant's own name.

The orchestrator does not count them as a question's content when it routes
(orchestrator/scenarios.py); Retrieval does not count them when it looks for a document's
title in a query (retrieval/query.TitleIndex).
"""

STOP_WORDS = frozenset(
    # Russian function words and question words
    "а и или но да нет не ни же ли бы то это этот эта эти этом тот та те так как какой какая "
    "какое какие каков что чем чего кто кого где когда куда откуда почему зачем сколько "
    "в во на с со к ко по о об от до из у за для при про над под без через между "
    "я ты вы мы он она оно они мне меня мой моя мое мои нам нас наш наша наше наши вам вас "
    "ваш ваша ваше ваши тебе тебя твой его ее их им ему ей себя свой "
    "есть был была было были будет быть уже еще ещё тут там здесь вот все всё весь вся "
    "очень можно нужно надо пожалуйста пж плиз большое огромное просто ну "
    "визиор visior бот "
    # English
    "a an the and or but not no yes is are was were be been being am do does did to of in "
    "on at by for with from about as into over under it its this that these those there "
    "here i me my we our us you your he she they them their his her what which who whom "
    "where when why how much many can could would should will shall may might must "
    "please pls very so just some any bot".split()
)
"""Words that carry no subject: they never count as content words."""
