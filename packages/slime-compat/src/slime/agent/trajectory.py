"""Not carried: importing `slime.agent.trajectory` fails in one line (`slime.agent._not_carried`)."""

from slime.agent._not_carried import refuse

refuse(__name__)
