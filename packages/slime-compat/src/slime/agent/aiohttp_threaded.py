"""Not carried: importing `slime.agent.aiohttp_threaded` fails in one line (`slime.agent._not_carried`)."""

from slime.agent._not_carried import refuse

refuse(__name__)
